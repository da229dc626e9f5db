"""Actions on an existing turn: post client tool results, cancel, read the CompositionTrace."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, TurnId, WaitSeconds
from api_gateway.openapi import error_responses
from api_gateway.turn_view import to_turn
from shared.models.trace import TurnTrace
from shared.models.turn import ToolResultsRequest, Turn, TurnHandle, TurnStatus

__all__ = ["router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)

_NOT_FOUND = {404: "`not_found`: no such turn in the caller's organisation."}


@router.post(
    "/{turn_id}/tool-results",
    status_code=202,
    response_model=TurnHandle,
    operation_id="postToolResults",
    summary="Post client tool results",
    response_description="The results were accepted; the turn is queued to resume (without `wait`).",
    responses={
        200: {"model": Turn, "description": "With `wait`: the turn once it left `queued`/`running`, or as it stands."},
        **error_responses(
            401,
            413,
            422,
            503,
            specific={
                **_NOT_FOUND,
                409: (
                    "`turn_not_awaiting_tool_results`: the turn is not in `requires_client_tools` (it never was, "
                    "its results were posted already, or it timed out)."
                ),
            },
        ),
    },
)
async def post_tool_results(
    turn_id: TurnId, body: ToolResultsRequest, caller: Caller, gateway: Gateway, wait: WaitSeconds = None
) -> JSONResponse:
    """Client tool outputs: the same turn resumes on any worker."""
    service = gateway.turn_service
    row = await run_in_threadpool(service.resume, turn_id, body, org_id=caller.org_id)
    if wait:
        row = await service.wait(row, org_id=caller.org_id, seconds=wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)


@router.post(
    "/{turn_id}/cancel",
    response_model=Turn,
    operation_id="cancelTurn",
    summary="Cancel a turn",
    response_description="The turn, now `cancelled`.",
    responses=error_responses(
        401, 503, specific={**_NOT_FOUND, 409: "`turn_finished`: the turn is already completed, failed or cancelled."}
    ),
)
async def cancel_turn(turn_id: TurnId, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Cancel a turn that has not finished; its session is free at once."""
    row = await run_in_threadpool(gateway.turn_service.cancel, turn_id, org_id=caller.org_id)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


@router.get(
    "/{turn_id}/trace",
    response_model=TurnTrace,
    operation_id="getTurnTrace",
    summary="Read a turn's trace",
    response_description="The turn's CompositionTrace.",
    responses=error_responses(401, 503, specific=_NOT_FOUND),
)
async def get_trace(turn_id: TurnId, caller: Caller, gateway: Gateway) -> TurnTrace:
    """The turn's CompositionTrace: the live one while it runs, else the committed one."""
    steps = await run_in_threadpool(gateway.turn_service.trace, turn_id, org_id=caller.org_id)
    return TurnTrace(turn_id=turn_id, steps=steps)
