"""``/v1/turns``: start a turn, read it (with long-poll)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerError
from redis import RedisError
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.expiry import expire_overdue
from api_gateway.ids import is_session_id, is_turn_id, new_session_id, new_turn_id
from api_gateway.state import GatewayState
from shared.broker import send_step
from shared.db.tables import TurnRow
from shared.db.turns import IdempotencyConflict, NewTurn, SessionBusy, to_turn
from shared.models.envelope import TurnEnvelope
from shared.models.turn import Turn, TurnHandle, TurnRequest, TurnStatus
from shared.task_names import StepName

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)

WaitSeconds = Annotated[float | None, Query(ge=0, le=60, description="Long-poll up to this many seconds.")]
_IN_FLIGHT = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value)


@router.post("", status_code=202, response_model=TurnHandle, responses={200: {"model": Turn}})
async def create_turn(body: TurnRequest, caller: Caller, gateway: Gateway, wait: WaitSeconds = None) -> JSONResponse:
    """Start a turn: a new session when ``session_id`` is absent, else a follow-up turn."""
    _check_client_tools(gateway, body)
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
    if row.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value and await run_in_threadpool(
        expire_overdue, gateway, turn_id=turn_id
    ):
        row = await run_in_threadpool(require_turn, gateway, turn_id, caller.org_id)
    if wait and row.status in _IN_FLIGHT:
        row = await wait_for(gateway, turn_id, caller.org_id, wait)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


def _check_client_tools(gateway: GatewayState, body: TurnRequest) -> None:
    clashes = sorted(gateway.catalog.server_tool_names.intersection(tool.name for tool in body.tools))
    if clashes:
        raise ApiError(
            422,
            "invalid_request",
            f"client tools may not take the name of a server tool: {', '.join(clashes)}",
            [{"loc": ["body", "tools"], "msg": "name taken by a server tool", "type": "value_error"}],
        )


def _record_turn(gateway: GatewayState, body: TurnRequest, org_id: str, user_id: str) -> TurnRow:
    new_session = body.session_id is None
    if new_session:
        if body.mode is not None and gateway.catalog.get(body.mode) is None:
            raise ApiError(
                422,
                "invalid_request",
                f"unknown mode {body.mode!r}; the catalog has: {', '.join(gateway.catalog.mode_names)}",
                [{"loc": ["body", "mode"], "msg": "unknown mode", "type": "value_error"}],
            )
        session_id = new_session_id()
    else:
        assert body.session_id is not None
        session_id = body.session_id
        if not is_session_id(session_id) or gateway.sessions.get(session_id, org_id=org_id) is None:
            raise ApiError(404, "session_not_found", f"session {session_id!r} does not exist")
        expire_overdue(gateway, session_id=session_id)
    request = body.model_dump(mode="json", exclude={"idempotency_key"})
    turn = NewTurn(
        turn_id=new_turn_id(),
        session_id=session_id,
        org_id=org_id,
        user_id=user_id,
        new_session=new_session,
        requested_mode=body.mode,
        request=request,
        request_hash=hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest(),
        idempotency_key=body.idempotency_key,
    )
    try:
        row, created = gateway.turns.create(turn, now=datetime.now(UTC))
    except SessionBusy as exc:
        raise ApiError(409, "session_busy", f"session {session_id!r} has a turn that is not finished") from exc
    except IdempotencyConflict as exc:
        raise ApiError(
            409, "idempotency_key_reused", "this idempotency_key was used before with a different request"
        ) from exc
    if created:
        _enqueue(gateway, row)
    return row


def _enqueue(gateway: GatewayState, row: TurnRow) -> None:
    try:
        send_step(gateway.producer, TurnEnvelope(turn_id=row.turn_id, step=StepName.REQUEST_HANDLER))
    except (BrokerError, RedisError, OSError) as exc:
        logger.error("could not enqueue turn %s: %s", row.turn_id, exc)
        gateway.turns.discard(row.turn_id)
        raise ApiError(503, "unavailable", "the task broker is unavailable; the turn was not accepted") from exc


def require_turn(gateway: GatewayState, turn_id: str, org_id: str) -> TurnRow:
    row = gateway.turns.get(turn_id, org_id=org_id) if is_turn_id(turn_id) else None
    if row is None:
        raise ApiError(404, "not_found", f"turn {turn_id!r} does not exist")
    return row


async def wait_for(gateway: GatewayState, turn_id: str, org_id: str, seconds: float) -> TurnRow:
    deadline = time.monotonic() + seconds
    delay = 0.02
    while True:
        row = await run_in_threadpool(require_turn, gateway, turn_id, org_id)
        if row.status not in _IN_FLIGHT or time.monotonic() >= deadline:
            return row
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.25)
