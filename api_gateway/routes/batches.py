"""``/v1/batches``: many turns at once, their progress, their results as JSON Lines."""

from __future__ import annotations

import json
from collections.abc import Iterator

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.services import BatchService
from shared.models.batch import Batch, BatchRequest
from shared.turn_view import to_turn

__all__ = ["router"]

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=AuthenticatedRoute)


@router.post("", status_code=202, response_model=Batch)
async def create_batch(body: BatchRequest, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Start every request of the batch as its own turn."""
    service = gateway.batch_service
    batch = await run_in_threadpool(service.record, body, org_id=caller.org_id, user_id=caller.user_id)
    return JSONResponse(batch.model_dump(mode="json"), status_code=202)


@router.get("/{batch_id}", response_model=Batch)
async def get_batch(batch_id: str, caller: Caller, gateway: Gateway) -> Batch:
    """The batch's progress: its turns' counts by status."""
    return await run_in_threadpool(gateway.batch_service.progress, batch_id, org_id=caller.org_id)


@router.get("/{batch_id}/results", response_class=StreamingResponse)
async def get_results(batch_id: str, caller: Caller, gateway: Gateway) -> StreamingResponse:
    """One Turn per line (JSON Lines), in request order."""
    await run_in_threadpool(gateway.batch_service.require, batch_id, org_id=caller.org_id)
    return StreamingResponse(_lines(gateway.batch_service, batch_id), media_type="application/x-ndjson")


def _lines(batches: BatchService, batch_id: str) -> Iterator[bytes]:
    for row in batches.turns(batch_id):
        yield json.dumps(to_turn(row).model_dump(mode="json", by_alias=True)).encode() + b"\n"
