"""OpenAIBatchService: OpenAI's Batch API over Aptix batches (``/openai/v1/batches``).

Creating a batch records its row (``validating``), then reads its input file line by line
(``batch_lines``): a file with a bad line makes the batch ``failed`` with every bad line in
``errors.data``, and nothing runs; a valid one is staged line by line as turns of the face (each
turn's extras carry its ``custom_id``) and recorded as the Aptix batch of the same id through
``BatchService``, so its turns go through fair admission, the model rate limits and the batch
priority like any batch turn. Validation runs inside the create request: the answer is the batch
``in_progress`` or ``failed``.

Everything after is read from the turns (``batch_view``). The first read that finds the batch ended
writes when it ended and its output and error files (rendered from the turns when downloaded:
``batch_output``). A batch past its ``expires_at`` with requests still queued or running is noted
expired and those requests are cancelled, on the next read or by the gateways' sweep, whichever
comes first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from api_gateway.ids import is_batch_id, new_batch_id
from api_gateway.openai.batch_lines import BatchLine, LineError, check_line
from api_gateway.openai.batch_output import Part, render_lines
from api_gateway.openai.batch_view import ENDED, batch_object, batch_status
from api_gateway.openai.errors import invalid, param_of
from api_gateway.openai.file_service import DEFAULT_EXPIRY_SECONDS, FileService, check_expires_after, new_file_id
from api_gateway.openai.requests import check_metadata
from api_gateway.openai.response_service import ResponseService
from api_gateway.openai.turn_requests import turn_parts
from api_gateway.services.batch_service import BatchService
from api_gateway.services.batch_staging import StagedBatch
from api_gateway.services.errors import Conflict, NotFound, ServiceError
from api_gateway.services.turn_service import TurnService
from shared.db.batches import BatchRepository
from shared.db.openai_batches import (
    OpenAIBatchKeyTaken,
    OpenAIBatchRecord,
    OpenAIBatchRepository,
    UnknownBatchCursor,
)
from shared.db.openai_files import FileRecord
from shared.models.turn import TurnStatus
from shared.webhooks import WebhookSender

__all__ = ["ENDPOINT", "MAX_ERRORS", "OpenAIBatchService"]

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/responses"
"""The one endpoint a batch here may name."""
COMPLETION_WINDOW = "24h"
MAX_ERRORS = 1000
"""The most bad lines a failed batch's ``errors.data`` lists (the first ones)."""
_KNOWN = frozenset(
    {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after", "webhook_url"}
)
_MAX_KEY = 255
_STALE_VALIDATION = timedelta(hours=1)
"""A batch still ``validating`` this long after its creation lost its gateway: it is made ``failed``."""


class OpenAIBatchService:
    """The Batch API of the OpenAI face; built once per gateway."""

    def __init__(
        self,
        *,
        batches: OpenAIBatchRepository,
        aptix: BatchService,
        aptix_batches: BatchRepository,
        turns: TurnService,
        files: FileService,
        responses: ResponseService,
        window_seconds: float,
        clock: Callable[[], datetime],
        webhook_sender: WebhookSender | None = None,
    ) -> None:
        self._batches = batches
        self._aptix = aptix
        self._aptix_batches = aptix_batches
        self._turns = turns
        self._files = files
        self._responses = responses
        self._window = timedelta(seconds=window_seconds)
        self._clock = clock
        self._webhook_sender = webhook_sender

    def create(self, body: object, *, org_id: str, user_id: str, idempotency_key: str | None) -> dict[str, Any]:
        """Create a batch on an uploaded file: validate every line, then run them all, or fail it.

        Args:
            body: the decoded JSON body.
            org_id: the caller's organisation.
            user_id: the caller.
            idempotency_key: the ``Idempotency-Key`` header, if any.

        Returns:
            The ``Batch``: ``in_progress`` (every line became a queued turn) or ``failed`` (``errors``); for
            a repeated key with the same body, the first one as it stands.

        Raises:
            InvalidRequest: the body (400 naming the field): an endpoint other than ``/v1/responses``, a
                completion window other than ``24h``, a file not uploaded for ``batch``.
            NotFound: ``input_file_id`` names no file of the organisation.
            Conflict: ``idempotency_key_reused``.
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        fields = _check_body(body)
        if idempotency_key is not None:
            if not idempotency_key or len(idempotency_key) > _MAX_KEY:
                raise invalid(f"Idempotency-Key must be 1 to {_MAX_KEY} characters", ("Idempotency-Key",))
            earlier = self._batches.by_idempotency_key(org_id, idempotency_key)
            if earlier is not None:
                return self._replay(earlier, fields["request_hash"])
        try:
            source = self._files.get(fields["input_file_id"], org_id=org_id)
        except NotFound as exc:
            raise NotFound(
                "not_found", f"No such File object: {fields['input_file_id']}",
                [{"loc": ["body", "input_file_id"], "msg": "unknown file", "type": "value_error"}],
            ) from exc  # fmt: skip
        if source.purpose != "batch":
            raise invalid(f"file {source.file_id!r} was not uploaded for purpose 'batch'", ("input_file_id",))
        batch_id = new_batch_id()
        now = self._clock()
        record = OpenAIBatchRecord(
            batch_id=batch_id, org_id=org_id, user_id=user_id, input_file_id=source.file_id, endpoint=ENDPOINT,
            completion_window=COMPLETION_WINDOW, client_metadata=fields["metadata"],
            output_expires_seconds=fields["output_expires_seconds"], webhook_url=fields["webhook_url"],
            idempotency_key=idempotency_key, request_hash=fields["request_hash"], created_at=now,
            expires_at=now + self._window,
        )  # fmt: skip
        webhook_url = fields["webhook_url"]
        with self._aptix.stage(batch_id, org_id=org_id, user_id=user_id, webhook_url=webhook_url) as staged:
            try:
                self._batches.add(record)
            except OpenAIBatchKeyTaken:
                winner = self._batches.by_idempotency_key(org_id, str(idempotency_key))
                if winner is None:
                    raise Conflict(
                        "idempotency_key_reused", "a concurrent request with this Idempotency-Key failed; retry"
                    ) from None
                return self._replay(winner, fields["request_hash"])
            errors, count = self._stage_lines(source, staged)
            if errors or count == 0:
                if count == 0:
                    errors = [LineError(0, "empty_file", "The input file holds no request.", "input_file_id")]
                self._fail(batch_id, errors=errors, total=count)
                return self._view(self._require(batch_id, org_id=org_id))
            try:
                self._aptix.commit(staged, batch_id=batch_id, org_id=org_id, user_id=user_id,
                                   webhook_url=webhook_url, idempotency_key=None)  # fmt: skip
            except ServiceError:
                self._batches.remove(batch_id)
                raise
        self._batches.start(batch_id, total=count, at=self._clock())
        logger.info("openai batch %s: %d requests", batch_id, count)
        return self._view(self._require(batch_id, org_id=org_id))

    def get(self, batch_id: str, *, org_id: str) -> dict[str, Any]:
        """The caller's batch as it stands (``Batch``).

        Raises:
            NotFound: no such batch of the caller's organisation.
        """
        return self._view(self._require(batch_id, org_id=org_id))

    def cancel(self, batch_id: str, *, org_id: str) -> dict[str, Any]:
        """Cancel the batch: its requests not started are cancelled at once, running ones finish.

        A batch that ended (or failed) is returned as it is; a second cancel answers the batch as it stands.

        Raises:
            NotFound: no such batch of the caller's organisation.
        """
        record = self._settle(self._require(batch_id, org_id=org_id))
        if record.in_progress_at is not None and record.failed_at is None and record.finished_at is None:
            with contextlib.suppress(Conflict):  # every request had ended meanwhile
                self._aptix.cancel(batch_id, org_id=org_id, running="finish")
        return self._view(record)

    def page(self, *, org_id: str, after: str | None, limit: int) -> dict[str, Any]:
        """A page of the caller's batches, newest first (OpenAI's list shape).

        Raises:
            InvalidRequest: ``after`` names no batch of the organisation.
        """
        try:
            rows, has_more = self._batches.page(org_id, limit=limit, after=after)
        except UnknownBatchCursor as exc:
            raise invalid(f"after: {after!r} is not a batch of this organisation", ("after",)) from exc
        data = [self._view(row) for row in rows]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }

    def file_content(self, file: FileRecord) -> Iterator[bytes]:
        """The lines of a batch's output or error file, rendered from its turns (check the caller first)."""
        assert file.batch_id is not None and file.batch_part in ("output", "error")
        batch = self._batches.get(file.batch_id, org_id=file.org_id)
        expired = batch is not None and batch.expired_at is not None
        part: Part = "output" if file.batch_part == "output" else "error"
        return render_lines(self._aptix.turns(file.batch_id), part=part, expired=expired)

    def sweep(self) -> int:
        """Expire the batches past their window and fail those whose validation was interrupted.

        Returns:
            How many batches it settled.
        """
        now = self._clock()
        settled = 0
        for record in self._batches.overdue(now=now):
            self._settle(record)
            settled += 1
        for record in self._batches.stale_validating(older_than=now - _STALE_VALIDATION):
            self._settle(record)
            settled += 1
        return settled

    def _require(self, batch_id: str, *, org_id: str) -> OpenAIBatchRecord:
        found = self._batches.get(batch_id, org_id=org_id) if is_batch_id(batch_id) else None
        if found is None:
            raise NotFound("not_found", f"No such Batch object: {batch_id}")
        return found

    def _replay(self, earlier: OpenAIBatchRecord, request_hash: str) -> dict[str, Any]:
        if earlier.request_hash != request_hash:
            raise Conflict("idempotency_key_reused", "this Idempotency-Key was used before with a different request")
        return self._view(earlier)

    def _stage_lines(self, source: FileRecord, staged: StagedBatch) -> tuple[list[LineError], int]:
        """Check every line of ``source``; stage the valid ones while none was bad.

        Returns:
            The bad lines (the first :data:`MAX_ERRORS`) and how many requests the file holds.
        """
        errors: list[LineError] = []
        seen: set[str] = set()
        count = 0
        for number, raw in enumerate(self._files.lines(source), start=1):
            if not raw.strip():
                continue
            count += 1
            checked = check_line(raw, number, endpoint=ENDPOINT, seen=seen, check_request=self._responses.check_model)
            if isinstance(checked, LineError):
                if len(errors) < MAX_ERRORS:
                    errors.append(checked)
                continue
            if errors:
                continue  # the batch fails: what is left is only checked
            try:
                self._stage(checked, staged)
            except ServiceError as exc:
                if len(errors) < MAX_ERRORS:
                    errors.append(LineError(number, exc.code, exc.message, _param(exc.details)))
        return errors, count

    def _stage(self, line: BatchLine, staged: StagedBatch) -> None:
        request = line.request
        echo = request.echoed(self._responses.model_for(request, mode=request.mode))
        turn_request, extras = turn_parts(
            request, session_id=None, idempotency_key=None, custom_id=line.custom_id, echo=echo
        )
        staged.add(turn_request, loc=("line", line.number), extras=extras)

    def _fail(self, batch_id: str, *, errors: list[LineError], total: int) -> None:
        deliveries = self._batches.fail(batch_id, errors=[error.as_json() for error in errors], total=total,
                                        at=self._clock())  # fmt: skip
        if deliveries and self._webhook_sender is not None:
            self._webhook_sender.send(deliveries)

    def _settle(self, record: OpenAIBatchRecord) -> OpenAIBatchRecord:
        """Bring the batch's record up to what its turns say: started, expired (its requests cancelled), ended."""
        if record.failed_at is not None or record.finished_at is not None:
            return record
        now = self._clock()
        if record.in_progress_at is None:
            aptix = self._aptix_batches.get(record.batch_id, org_id=record.org_id)
            if aptix is not None:  # its gateway stopped between the Aptix batch and noting it
                self._batches.start(record.batch_id, total=aptix.total, at=aptix.created_at)
            elif record.created_at <= now - _STALE_VALIDATION:
                message = "The batch's validation was interrupted (its gateway stopped); create it again."
                self._fail(record.batch_id, errors=[LineError(0, "validation_interrupted", message)], total=0)
            return self._reread(record)
        counts = self._aptix_batches.counts(record.batch_id)
        moving = any(counts[status] for status in TurnStatus.in_flight())
        if moving and record.expired_at is None and record.expires_at <= now:
            self._expire(record)
            record = self._reread(record)
            counts = self._aptix_batches.counts(record.batch_id)
        totals = self._batches.totals(record.batch_id)
        status = batch_status(record, counts, cancelling=totals.cancel_requested_at is not None)
        if status in ENDED:
            self._finish(record, ended_at=totals.last_end or now)
            record = self._reread(record)
        return record

    def _expire(self, record: OpenAIBatchRecord) -> None:
        """Note the batch expired, then cancel its requests still queued or running."""
        if not self._batches.note_expired(record.batch_id, at=record.expires_at):
            return
        logger.info("openai batch %s expired; cancelling its unfinished requests", record.batch_id)
        try:
            self._aptix.cancel(record.batch_id, org_id=record.org_id, running="finish")
        except Conflict:
            return  # every request had ended meanwhile
        for turn_id in self._aptix_batches.turn_ids(record.batch_id, statuses=(TurnStatus.RUNNING,)):
            try:
                self._turns.cancel(turn_id, org_id=record.org_id)
            except Conflict:
                continue  # it ended meanwhile

    def _finish(self, record: OpenAIBatchRecord, *, ended_at: datetime) -> None:
        """Write the batch's end and its output and error files (their sizes counted by rendering them once)."""
        now = self._clock()
        seconds = record.output_expires_seconds or DEFAULT_EXPIRY_SECONDS
        expired = record.expired_at is not None
        files = []
        parts: tuple[Part, ...] = ("output", "error")
        for part in parts:
            size = lines = 0
            for line in render_lines(self._aptix.turns(record.batch_id), part=part, expired=expired):
                size += len(line)
                lines += 1
            if lines:
                files.append(FileRecord(
                    file_id=new_file_id(), org_id=record.org_id, purpose="batch_output",
                    filename=f"{record.batch_id}_{part}.jsonl", bytes=size, lines=lines, created_at=now,
                    expires_at=now + timedelta(seconds=seconds), batch_id=record.batch_id, batch_part=part,
                ))  # fmt: skip
        self._batches.finish(record.batch_id, at=ended_at, files=files)

    def _reread(self, record: OpenAIBatchRecord) -> OpenAIBatchRecord:
        found = self._batches.get(record.batch_id, org_id=record.org_id)
        assert found is not None
        return found

    def _view(self, record: OpenAIBatchRecord) -> dict[str, Any]:
        record = self._settle(record)
        if record.in_progress_at is None:
            return batch_object(record, None, None)
        counts = self._aptix_batches.counts(record.batch_id)
        return batch_object(record, counts, self._batches.totals(record.batch_id))


def _check_body(body: object) -> dict[str, Any]:
    """The create request's fields, checked (400 naming the field otherwise)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", ())
    for name in body:
        if name not in _KNOWN:
            raise invalid(f"Unknown parameter: {name!r}.", (name,), code="unknown_parameter")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if body.get(name) is None:
            raise invalid(f"Missing required parameter: {name!r}.", (name,), code="missing_required_parameter")
    file_id = body["input_file_id"]
    if not isinstance(file_id, str) or not file_id:
        raise invalid("input_file_id must be a file id", ("input_file_id",))
    if body["endpoint"] != ENDPOINT:
        raise invalid(
            f"endpoint {body['endpoint']!r} is not supported here: Aptix batches run {ENDPOINT!r} only",
            ("endpoint",),
        )
    if body["completion_window"] != COMPLETION_WINDOW:
        raise invalid(f"completion_window must be {COMPLETION_WINDOW!r}", ("completion_window",))
    seconds = None
    expiry = body.get("output_expires_after")
    if expiry is not None:
        if not isinstance(expiry, dict):
            raise invalid("output_expires_after must be {anchor, seconds}", ("output_expires_after",))
        seconds = check_expires_after(expiry.get("anchor"), expiry.get("seconds"), param="output_expires_after")
    webhook_url = body.get("webhook_url")
    if webhook_url is not None and (not isinstance(webhook_url, str) or not webhook_url):
        raise invalid("webhook_url must be a URL", ("webhook_url",))
    metadata = body.get("metadata")
    return {
        "input_file_id": file_id,
        "metadata": None if metadata is None else check_metadata(metadata),
        "output_expires_seconds": seconds,
        "webhook_url": webhook_url,
        "request_hash": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
    }


def _param(details: Any) -> str | None:
    """``body.<param>`` of a line a staging check refused (``loc`` ``["line", n, field, ...]``)."""
    if isinstance(details, list) and details and isinstance(details[0], dict):
        loc = details[0].get("loc")
        if isinstance(loc, list | tuple) and len(loc) > 2:
            inner = param_of(list(loc[2:]))
            return None if inner is None else f"body.{inner}"
    return None
