"""``/v1/batches``: many turns at once, their progress, their results as JSON Lines."""

from __future__ import annotations

import json
from collections.abc import Iterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, BatchId, Caller, Gateway
from api_gateway.openapi import JSON_LINES, error_responses
from api_gateway.services import BatchService
from shared.models.batch import Batch, BatchRequest
from shared.models.turn import Turn
from shared.turn_view import to_turn

__all__ = ["router"]

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=AuthenticatedRoute)

_NOT_FOUND = {404: "`not_found`: no such batch in the caller's organisation."}


class _JsonLinesResponse(StreamingResponse):
    """A streamed body of JSON Lines: one JSON value per line."""

    media_type = JSON_LINES


@router.post(
    "",
    status_code=202,
    response_model=Batch,
    operation_id="createBatch",
    summary="Start a batch of turns",
    response_description="Every request was recorded as a queued turn.",
    responses=error_responses(
        401,
        413,
        422,
        503,
        specific={
            404: "`session_not_found`: a request's `session_id` names no session of the caller's organisation.",
            409: "`session_busy`: a request's session has a turn that is not finished.",
            422: (
                "Also more requests than `APTIX_MAX_BATCH_REQUESTS`, two requests continuing one session, or a "
                "request `POST /v1/turns` would refuse. Nothing was recorded."
            ),
        },
    ),
)
async def create_batch(body: BatchRequest, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Start every request of the batch as its own turn, all of them or none."""
    service = gateway.batch_service
    batch = await run_in_threadpool(service.record, body, org_id=caller.org_id, user_id=caller.user_id)
    return JSONResponse(batch.model_dump(mode="json"), status_code=202)


@router.get(
    "/{batch_id}",
    response_model=Batch,
    operation_id="getBatch",
    summary="Read a batch's progress",
    response_description="The batch with its turns' counts by status.",
    responses=error_responses(401, 503, specific=_NOT_FOUND),
)
async def get_batch(batch_id: BatchId, caller: Caller, gateway: Gateway) -> Batch:
    """The batch's progress: its turns' counts by status."""
    return await run_in_threadpool(gateway.batch_service.progress, batch_id, org_id=caller.org_id)


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
    return _JsonLinesResponse(_lines(gateway.batch_service, batch_id))


def _lines(batches: BatchService, batch_id: str) -> Iterator[bytes]:
    for row in batches.turns(batch_id):
        yield json.dumps(to_turn(row).model_dump(mode="json", by_alias=True)).encode() + b"\n"
