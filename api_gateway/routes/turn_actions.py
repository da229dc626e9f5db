"""Actions on an existing turn: post client tool results, cancel, read the CompositionTrace."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis import RedisError
from starlette.concurrency import run_in_threadpool

from api_gateway.admission import BrokerUnavailable, enqueue_reentry
from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.expiry import expire_overdue
from api_gateway.routes.turns import WaitSeconds, require_turn, wait_for
from api_gateway.state import GatewayState
from api_gateway.turn_view import to_turn
from shared.db.records import TurnRecord
from shared.models.trace import TraceStep, TurnTrace
from shared.models.turn import Turn, TurnHandle, ToolResultsRequest, TurnStatus
from shared.result import ErrorCode, ErrorInfo

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)


@router.post("/{turn_id}/tool-results", status_code=202, response_model=TurnHandle, responses={200: {"model": Turn}})
async def post_tool_results(
    turn_id: str, body: ToolResultsRequest, caller: Caller, gateway: Gateway, wait: WaitSeconds = None
) -> JSONResponse:
    """Client tool outputs: the same turn resumes on any worker."""
    row = await run_in_threadpool(_resume, gateway, turn_id, caller.org_id, body)
    if wait:
        row = await wait_for(gateway, turn_id, caller.org_id, wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)


@router.post("/{turn_id}/cancel", response_model=Turn)
async def cancel_turn(turn_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Cancel a turn that has not finished; its session is free at once."""
    row = await run_in_threadpool(_cancel, gateway, turn_id, caller.org_id)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


@router.get("/{turn_id}/trace", response_model=TurnTrace)
async def get_trace(turn_id: str, caller: Caller, gateway: Gateway) -> TurnTrace:
    """The turn's CompositionTrace: the live one while it runs, else the committed one."""
    row = await run_in_threadpool(require_turn, gateway, turn_id, caller.org_id)
    live = await run_in_threadpool(_live_state_trace, gateway, turn_id)
    steps = live if live is not None and len(live) >= len(row.trace) else [TraceStep.model_validate(s) for s in row.trace]
    return TurnTrace(turn_id=turn_id, steps=steps)


def _resume(gateway: GatewayState, turn_id: str, org_id: str, body: ToolResultsRequest) -> TurnRecord:
    row = require_turn(gateway, turn_id, org_id)
    expire_overdue(gateway, turn_id=turn_id)
    results = [result.model_dump() for result in body.tool_results]
    try:
        round_ = gateway.turns.accept_tool_results(
            turn_id,
            results=results,
            now=datetime.now(UTC),
            deadline_at=gateway.deadline(),
            before_commit=lambda round_: enqueue_reentry(gateway, turn_id, round_=round_, batch=row.batch_id is not None),
        )
    except BrokerUnavailable as exc:
        raise ApiError(503, "unavailable", "the task broker or the state store is unavailable; the results were not accepted") from exc
    if round_ is None:
        current = require_turn(gateway, turn_id, org_id)
        raise ApiError(
            409,
            "turn_not_awaiting_tool_results",
            f"turn {turn_id!r} is {current.status}, not requires_client_tools",
        )
    return require_turn(gateway, turn_id, org_id)


def _cancel(gateway: GatewayState, turn_id: str, org_id: str) -> TurnRecord:
    row = require_turn(gateway, turn_id, org_id)
    expire_overdue(gateway, turn_id=turn_id)
    cancelled = gateway.turns.finish_early(
        turn_id,
        status=TurnStatus.CANCELLED,
        error=ErrorInfo(code=ErrorCode.CANCELLED, message="the turn was cancelled by the client"),
        now=datetime.now(UTC),
    )
    if cancelled is None:
        current = require_turn(gateway, turn_id, org_id)
        raise ApiError(409, "turn_finished", f"turn {turn_id!r} already finished ({current.status})")
    try:
        gateway.store.mark_cancelled(turn_id, ttl_seconds=7 * 86400)
        gateway.store.forget(turn_id)
    except RedisError:
        # The database already says cancelled and the commit point will not overwrite it; the
        # flag only stops the remaining steps early.
        logger.warning("could not flag turn %s as cancelled in Redis", row.turn_id)
    return cancelled


def _live_state_trace(gateway: GatewayState, turn_id: str) -> list[TraceStep] | None:
    try:
        state = gateway.store.load(turn_id)
    except RedisError:
        return None
    return None if state is None else state.trace
