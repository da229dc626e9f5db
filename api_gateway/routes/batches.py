"""``/v1/batches``: many turns at once (a JSON body or a JSON Lines upload), their progress, their results
as JSON Lines, their cancel, and the organisation's list of batches."""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Iterator
from typing import IO, Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, BatchId, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.openapi import JSON_LINES, QUOTA_EXCEEDED, error_responses
from api_gateway.services import BatchService
from api_gateway.services.batch_upload import record_upload
from api_gateway.upload_lines import spool_lines
from api_gateway.uploads import is_json_lines
from shared import strict_json
from shared.models.batch import Batch, BatchCancelRequest, BatchList, BatchRequest
from shared.models.turn import Turn
from shared.turn_view import to_turn

__all__ = ["CREATE_BATCH_BODY", "router"]

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=AuthenticatedRoute)

_NOT_FOUND = {404: "`not_found`: no such batch in the caller's organisation."}
_SPOOL_MEMORY_BYTES = 1024 * 1024
"""An upload is kept in memory up to this size as it arrives, then in a temporary file."""

CREATE_BATCH_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/BatchRequest"}},
        JSON_LINES: {
            "schema": {"$ref": "#/components/schemas/TurnRequest"},
            "description": (
                "A JSON Lines upload (also `application/x-ndjson`): one `TurnRequest` per line, blank lines "
                "ignored, at most `APTIX_MAX_UPLOAD_REQUESTS` lines and `APTIX_MAX_UPLOAD_BYTES` bytes, each line "
                "at most `APTIX_MAX_BODY_BYTES` bytes. The batch's `idempotency_key` and `webhook_url` come as "
                "query parameters."
            ),
        },
    },
}
"""``createBatch``'s request body: either media type (the route reads the body itself, to stream uploads)."""

IdempotencyKeyQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        description="The batch's `idempotency_key` (as the JSON body's field; the only way for an upload).",
    ),
]
WebhookUrlQuery = Annotated[
    str | None,
    Query(max_length=2048, description="A JSON Lines upload's `webhook_url` (a JSON body has its own field)."),
]


class _JsonLinesResponse(StreamingResponse):
    """A streamed body of JSON Lines: one JSON value per line."""

    media_type = JSON_LINES


@router.post(
    "",
    status_code=202,
    response_model=Batch,
    operation_id="createBatch",
    summary="Start a batch of turns",
    response_description="Every request was recorded as a queued turn (or reuses an earlier one), or the batch "
    "of this `idempotency_key` was returned.",
    openapi_extra={"requestBody": CREATE_BATCH_BODY},
    responses=error_responses(
        401,
        413,
        422,
        503,
        specific={
            404: "`session_not_found`: a request's `session_id` names no session of the caller's organisation.",
            429: QUOTA_EXCEEDED,
            409: (
                "`session_busy`: a request's session has a turn that is not finished. `idempotency_key_reused`: "
                "the batch's key was used with another body, or a request's key by an earlier turn with another "
                "request (the message names the request)."
            ),
            413: (
                "An upload larger than `APTIX_MAX_UPLOAD_BYTES`, or one of its lines longer than "
                '`APTIX_MAX_BODY_BYTES` (the message and `details[].loc`, `["line", n]`, name the line).'
            ),
            422: (
                "Also more requests than `APTIX_MAX_BATCH_REQUESTS` (a JSON body) or `APTIX_MAX_UPLOAD_REQUESTS` "
                "(an upload), two requests continuing one session or sharing an idempotency key, or a request "
                '`POST /v1/turns` would refuse; for an upload, the message and `details[].loc` (`["line", n, …]`) '
                "name the line. Nothing was recorded."
            ),
        },
    ),
)
async def create_batch(
    request: Request,
    caller: Caller,
    gateway: Gateway,
    idempotency_key: IdempotencyKeyQuery = None,
    webhook_url: WebhookUrlQuery = None,
) -> JSONResponse:
    """Start every request of the batch as its own turn, all of them or none."""
    service = gateway.batch_service
    if is_json_lines(request.headers.get("content-type")):
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY_BYTES) as spool:
            await spool_lines(request.stream(), spool, max_line_bytes=gateway.settings.max_body_bytes)
            spool.seek(0)
            record = functools.partial(
                record_upload, service, _lines(spool), org_id=caller.org_id, user_id=caller.user_id,
                webhook_url=webhook_url or None, idempotency_key=idempotency_key,
                max_requests=gateway.settings.max_upload_requests,
            )  # fmt: skip
            batch = await run_in_threadpool(record)
    else:
        body = _batch_request(await request.body(), idempotency_key=idempotency_key)
        batch = await run_in_threadpool(service.record, body, org_id=caller.org_id, user_id=caller.user_id)
    return JSONResponse(batch.model_dump(mode="json"), status_code=202)


@router.get(
    "",
    response_model=BatchList,
    operation_id="listBatches",
    summary="List the organisation's batches",
    response_description="A page of batches, newest first; `last_id` is the cursor of the next page.",
    responses=error_responses(
        401, 422, 503, specific={422: "Also an `after` that names no batch of the organisation."}
    ),
)
async def list_batches(
    caller: Caller,
    gateway: Gateway,
    limit: Annotated[int, Query(ge=1, le=100, description="At most this many batches (1 to 100).")] = 20,
    after: Annotated[
        str | None, Query(max_length=64, description="The `last_id` of the previous page: the batches older than it.")
    ] = None,
) -> BatchList:
    """The caller organisation's batches, newest first, in pages."""
    page = functools.partial(gateway.batch_service.page, org_id=caller.org_id, limit=limit, after=after)
    return await run_in_threadpool(page)


@router.get(
    "/{batch_id}",
    response_model=Batch,
    operation_id="getBatch",
    summary="Read a batch's progress",
    response_description="The batch with its status and its turns' counts by status.",
    responses=error_responses(401, 503, specific=_NOT_FOUND),
)
async def get_batch(batch_id: BatchId, caller: Caller, gateway: Gateway) -> Batch:
    """The batch's progress: its status and its turns' counts by status."""
    return await run_in_threadpool(gateway.batch_service.progress, batch_id, org_id=caller.org_id)


@router.post(
    "/{batch_id}/cancel",
    response_model=Batch,
    operation_id="cancelBatch",
    summary="Cancel a batch",
    response_description="The batch, `cancelling` (some turns still run) or `cancelled`.",
    responses=error_responses(
        401,
        422,
        503,
        specific={
            **_NOT_FOUND,
            409: "`batch_finished`: none of the batch's turns is unfinished; there is nothing to cancel.",
        },
    ),
)
async def cancel_batch(
    batch_id: BatchId, caller: Caller, gateway: Gateway, body: Annotated[BatchCancelRequest | None, Body()] = None
) -> Batch:
    """Cancel the turns not started at once; let running ones finish, or cancel them (``running``)."""
    running = (body or BatchCancelRequest()).running
    cancel = functools.partial(gateway.batch_service.cancel, batch_id, org_id=caller.org_id, running=running)
    return await run_in_threadpool(cancel)


@router.get(
    "/{batch_id}/results",
    response_class=_JsonLinesResponse,
    operation_id="getBatchResults",
    summary="Read a batch's results",
    responses={
        200: {
            "model": Turn,
            "description": "JSON Lines (`application/jsonl`): one `Turn` per line, in request order, as they stand.",
        },
        **error_responses(401, 503, specific=_NOT_FOUND),
    },
)
async def get_results(batch_id: BatchId, caller: Caller, gateway: Gateway) -> _JsonLinesResponse:
    """One Turn per line (JSON Lines), in request order."""
    await run_in_threadpool(gateway.batch_service.require, batch_id, org_id=caller.org_id)
    return _JsonLinesResponse(_results(gateway.batch_service, batch_id))


def _batch_request(raw: bytes, *, idempotency_key: str | None) -> BatchRequest:
    """The JSON body as a BatchRequest, refused as FastAPI would refuse a body model (422, ``loc`` from ``body``)."""
    try:
        data = strict_json.loads(raw) if raw else None
    except ValueError as exc:
        reason = f"{type(exc).__name__}: {exc}"
        details = [{"loc": ["body"], "msg": reason, "type": "json_invalid"}]
        raise ApiError(422, "invalid_request", "the request body is not valid JSON", details) from exc
    if (
        isinstance(data, dict)
        and idempotency_key is not None
        and data.setdefault("idempotency_key", idempotency_key) != idempotency_key
    ):
        details = [{"loc": ["query", "idempotency_key"], "msg": "differs from the body's", "type": "value_error"}]
        raise ApiError(422, "invalid_request", "idempotency_key: the query's and the body's differ", details)
    try:
        return BatchRequest.model_validate(data)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        if data is None:
            errors = [{"loc": ("body",), "msg": "Field required", "type": "missing"}]
        raise RequestValidationError(errors) from exc


def _lines(spool: IO[bytes]) -> Iterator[bytes]:
    yield from spool


def _results(batches: BatchService, batch_id: str) -> Iterator[bytes]:
    for row in batches.turns(batch_id):
        yield json.dumps(to_turn(row).model_dump(mode="json", by_alias=True)).encode() + b"\n"
