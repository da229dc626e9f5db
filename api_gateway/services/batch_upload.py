"""A batch as a JSON Lines upload: one TurnRequest per line, checked line by line, recorded all or none.

The gateway spools the upload's body to a temporary file as it arrives, refusing a line longer than
``APTIX_MAX_BODY_BYTES`` (``api_gateway.upload_lines``); :func:`record_upload` reads that file line by
line, stages each request (``batch_staging``) and records the batch. A line that is not JSON, not a
valid TurnRequest, or a request the gateway would refuse, refuses the whole upload with an error that
names the line (1-based, blank lines counted); nothing is recorded then.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from api_gateway.ids import new_batch_id
from api_gateway.services.batch_service import BatchService
from api_gateway.services.batch_staging import StagedBatch
from api_gateway.services.errors import InvalidRequest, ServiceError
from shared import strict_json
from shared.models.batch import Batch, BatchTurnRequest

__all__ = ["record_upload", "stage_lines"]


def record_upload(
    service: BatchService,
    lines: Iterable[bytes],
    *,
    org_id: str,
    user_id: str,
    webhook_url: str | None,
    idempotency_key: str | None,
    max_requests: int,
) -> Batch:
    """Record the batch of an uploaded body's lines (or return the earlier batch of ``idempotency_key``).

    Args:
        service: the gateway's batch service.
        lines: the body's lines (a binary file opened on the spooled upload).
        org_id: the caller's organisation.
        user_id: the caller.
        webhook_url: the batch's ``webhook_url`` (a query parameter of the upload).
        idempotency_key: the batch's key (a query parameter of the upload).
        max_requests: ``APTIX_MAX_UPLOAD_REQUESTS``.

    Raises:
        InvalidRequest: a line refused (see :func:`stage_lines`), or no request at all.
        ServiceError: what :meth:`BatchService.commit` raises.
    """
    batch_id = new_batch_id()
    with service.stage(batch_id, org_id=org_id, user_id=user_id, webhook_url=webhook_url) as staged:
        stage_lines(lines, staged, max_requests=max_requests)
        if staged.count == 0:
            raise InvalidRequest(
                "the upload holds no request (one TurnRequest per line)",
                [{"loc": ["body"], "msg": "no request", "type": "too_short"}],
            )
        return service.commit(staged, batch_id=batch_id, org_id=org_id, user_id=user_id,
                              webhook_url=webhook_url, idempotency_key=idempotency_key)  # fmt: skip


def stage_lines(lines: Iterable[bytes], staged: StagedBatch, *, max_requests: int) -> None:
    """Parse, validate and stage each non-blank line as a request of ``staged``.

    Raises:
        InvalidRequest: a line that is not JSON or not a valid TurnRequest, or more than
            ``max_requests`` requests; the message and each detail's ``loc`` (``["line", n, ...]``) name the line.
        ServiceError: what staging the request raises, its message prefixed with the line.
    """
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if staged.count >= max_requests:
            raise InvalidRequest(
                f"line {number}: an upload holds at most {max_requests} requests (APTIX_MAX_UPLOAD_REQUESTS)",
                [{"loc": ["line", number], "msg": "too many requests", "type": "too_long"}],
            )
        try:
            data = strict_json.loads(line)
        except ValueError as exc:
            raise InvalidRequest(
                f"line {number}: not valid JSON: {exc}",
                [{"loc": ["line", number], "msg": str(exc), "type": "json_invalid"}],
            ) from exc
        try:
            request = BatchTurnRequest.model_validate(data)
        except ValidationError as exc:
            raise _invalid_line(number, exc) from exc
        try:
            staged.add(request, loc=("line", number))
        except ServiceError as exc:
            if not exc.message.startswith("line "):
                exc.message = f"line {number}: {exc.message}"
                exc.args = (exc.message,)
            raise


def _invalid_line(number: int, exc: ValidationError) -> InvalidRequest:
    details: list[dict[str, Any]] = [
        {"loc": ["line", number, *error["loc"]], "msg": error["msg"], "type": error["type"]} for error in exc.errors()
    ]
    first = details[0]
    where = ".".join(str(part) for part in first["loc"][2:])
    return InvalidRequest(f"line {number}: {where + ': ' if where else ''}{first['msg']}", details)
