"""``/v1/turns``: start a turn, read it (with long-poll)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.expiry import expire_overdue
from api_gateway.admission import BrokerUnavailable, admit, enqueue_turns
from api_gateway.ids import is_turn_id
from api_gateway.state import GatewayState
from api_gateway.turn_view import to_turn
from shared.db.records import TurnRecord
from shared.db.turns import IdempotencyConflict, SessionBusy
from shared.models.turn import Turn, TurnHandle, TurnRequest, TurnStatus

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)

WaitSeconds = Annotated[float | None, Query(ge=0, le=60, description="Long-poll up to this many seconds.")]
_IN_FLIGHT = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value)


@router.post("", status_code=202, response_model=TurnHandle, responses={200: {"model": Turn}})
async def create_turn(body: TurnRequest, caller: Caller, gateway: Gateway, wait: WaitSeconds = None) -> JSONResponse:
    """Start a turn: a new session when ``session_id`` is absent, else a follow-up turn."""
    row = await run_in_threadpool(_record_turn, gateway, body, caller.org_id, caller.user_id)
    if wait:
        row = await wait_for(gateway, row.turn_id, caller.org_id, wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)


@router.get("/{turn_id}", response_model=Turn)
async def get_turn(turn_id: str, caller: Caller, gateway: Gateway, wait: WaitSeconds = None) -> JSONResponse:
    """The turn's state and result; ``?wait=S`` long-polls until it leaves queued/running."""
    row = await run_in_threadpool(require_turn, gateway, turn_id, caller.org_id)
    if row.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value:
        expired: int = await run_in_threadpool(expire_overdue, gateway, turn_id=turn_id)
        if expired:
            row = await run_in_threadpool(require_turn, gateway, turn_id, caller.org_id)
    if wait and row.status in _IN_FLIGHT:
        row = await wait_for(gateway, turn_id, caller.org_id, wait)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


def _record_turn(gateway: GatewayState, body: TurnRequest, org_id: str, user_id: str) -> TurnRecord:
    turn = admit(gateway, body, org_id=org_id, user_id=user_id)
    try:
        row, _created = gateway.turns.create(
            turn,
            now=datetime.now(UTC),
            deadline_at=gateway.deadline(),
            before_commit=lambda: enqueue_turns(gateway, [turn.turn_id]),
        )
    except BrokerUnavailable as exc:
        raise ApiError(503, "unavailable", "the task broker or the state store is unavailable; the turn was not accepted") from exc
    except SessionBusy as exc:
        raise ApiError(409, "session_busy", f"session {turn.session_id!r} has a turn that is not finished") from exc
    except IdempotencyConflict as exc:
        raise ApiError(
            409, "idempotency_key_reused", "this idempotency_key was used before with a different request"
        ) from exc
    return row


def require_turn(gateway: GatewayState, turn_id: str, org_id: str) -> TurnRecord:
    row = gateway.turns.get(turn_id, org_id=org_id) if is_turn_id(turn_id) else None
    if row is None:
        raise ApiError(404, "not_found", f"turn {turn_id!r} does not exist")
    return row


async def wait_for(gateway: GatewayState, turn_id: str, org_id: str, seconds: float) -> TurnRecord:
    deadline = time.monotonic() + seconds
    delay = 0.02
    while True:
        row = await run_in_threadpool(require_turn, gateway, turn_id, org_id)
        if row.status not in _IN_FLIGHT or time.monotonic() >= deadline:
            return row
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.25)
