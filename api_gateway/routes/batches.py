"""``/v1/batches``: many turns at once, their progress, their results as JSON Lines.

A batch's turns run through the same pipeline as single turns, at a lower broker priority
(``shared.models.envelope``), so a batch never starves an interactive turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.admission import BrokerUnavailable, admit, enqueue_turns
from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.ids import is_batch_id, new_batch_id
from api_gateway.state import GatewayState
from api_gateway.turn_view import to_turn
from shared.db.batches import BatchRecord
from shared.db.turns import SessionBusy
from shared.models.batch import Batch, BatchRequest

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/batches", tags=["batches"], route_class=AuthenticatedRoute)


@router.post("", status_code=202, response_model=Batch)
async def create_batch(body: BatchRequest, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Start every request of the batch as its own turn."""
    batch = await run_in_threadpool(_record_batch, gateway, body, caller.org_id, caller.user_id)
    return JSONResponse(batch.model_dump(mode="json"), status_code=202)


@router.get("/{batch_id}", response_model=Batch)
async def get_batch(batch_id: str, caller: Caller, gateway: Gateway) -> Batch:
    """The batch's progress: its turns' counts by status."""
    return await run_in_threadpool(_load_batch, gateway, batch_id, caller.org_id)


@router.get("/{batch_id}/results", response_class=StreamingResponse)
async def get_results(batch_id: str, caller: Caller, gateway: Gateway) -> StreamingResponse:
    """One Turn per line (JSON Lines), in request order."""
    await run_in_threadpool(_require_batch, gateway, batch_id, caller.org_id)
    return StreamingResponse(_lines(gateway, batch_id), media_type="application/x-ndjson")


def _record_batch(gateway: GatewayState, body: BatchRequest, org_id: str, user_id: str) -> Batch:
    limit = gateway.settings.max_batch_requests
    if len(body.requests) > limit:
        raise ApiError(
            422,
            "invalid_request",
            f"a batch holds at most {limit} requests (APTIX_MAX_BATCH_REQUESTS); this one has {len(body.requests)}",
            [{"loc": ["body", "requests"], "msg": "too many requests", "type": "too_long"}],
        )
    _check_distinct_sessions(body)
    batch_id = new_batch_id()
    turns = [
        admit(
            gateway,
            request,
            org_id=org_id,
            user_id=user_id,
            loc=("body", "requests", index),
            batch_id=batch_id,
            batch_index=index,
        )
        for index, request in enumerate(body.requests)
    ]
    now = datetime.now(UTC)
    row = BatchRecord(batch_id=batch_id, org_id=org_id, user_id=user_id, total=len(turns), created_at=now)
    try:
        gateway.batches.create(
            row,
            turns,
            now=now,
            deadline_at=gateway.deadline(),
            before_commit=lambda: enqueue_turns(gateway, [turn.turn_id for turn in turns], batch=True),
        )
    except SessionBusy as exc:
        raise ApiError(409, "session_busy", str(exc)) from exc
    except BrokerUnavailable as exc:
        raise ApiError(503, "unavailable", "the task broker or the state store is unavailable; the batch was not accepted") from exc
    return Batch(batch_id=batch_id, total=len(turns), counts=gateway.batches.counts(batch_id), created_at=now)


def _check_distinct_sessions(body: BatchRequest) -> None:
    seen: dict[str, int] = {}
    for index, request in enumerate(body.requests):
        if request.idempotency_key is not None:
            raise ApiError(
                422,
                "invalid_request",
                f"requests[{index}]: idempotency_key is not supported inside a batch",
                [{"loc": ["body", "requests", index, "idempotency_key"], "msg": "not supported", "type": "value_error"}],
            )
        if request.session_id is None:
            continue
        if request.session_id in seen:
            raise ApiError(
                422,
                "invalid_request",
                f"requests[{seen[request.session_id]}] and requests[{index}] continue the same session; "
                "a session runs one turn at a time",
                [{"loc": ["body", "requests", index, "session_id"], "msg": "repeated session", "type": "value_error"}],
            )
        seen[request.session_id] = index


def _require_batch(gateway: GatewayState, batch_id: str, org_id: str) -> BatchRecord:
    row = gateway.batches.get(batch_id, org_id=org_id) if is_batch_id(batch_id) else None
    if row is None:
        raise ApiError(404, "not_found", f"batch {batch_id!r} does not exist")
    return row


def _load_batch(gateway: GatewayState, batch_id: str, org_id: str) -> Batch:
    row = _require_batch(gateway, batch_id, org_id)
    return Batch(batch_id=row.batch_id, total=row.total, counts=gateway.batches.counts(batch_id), created_at=row.created_at)


def _lines(gateway: GatewayState, batch_id: str) -> Iterator[bytes]:
    for row in gateway.batches.turns(batch_id):
        yield json.dumps(to_turn(row).model_dump(mode="json", by_alias=True)).encode() + b"\n"
