"""Actions on an existing turn: post client tool results, cancel, read the CompositionTrace."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, StreamFlag, WaitSeconds
from api_gateway.routes.turn_events import STREAMED_OR_TURN
from api_gateway.services import InvalidRequest
from shared.models.trace import TurnTrace
from shared.models.turn import ToolResultsRequest, Turn, TurnHandle, TurnStatus
from shared.turn_view import to_turn

__all__ = ["router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)


@router.post(
    "/{turn_id}/tool-results",
    status_code=202,
    response_model=TurnHandle,
    responses=STREAMED_OR_TURN,
)
async def post_tool_results(
    turn_id: str,
    body: ToolResultsRequest,
    caller: Caller,
    gateway: Gateway,
    wait: WaitSeconds = None,
    stream: StreamFlag = False,
) -> Response:
    """Client tool outputs: the same turn resumes on any worker.

    With ``?stream=true`` the answer is the events of the round this starts (``text/event-stream``)."""
    service = gateway.turn_service
    if stream:
        if wait:
            raise InvalidRequest(
                "results are either streamed or waited for: give ?stream or ?wait, not both",
                [{"loc": ["query", "wait"], "msg": "not with stream", "type": "value_error"}],
            )
        streams = gateway.event_streams
        streams.reserve()
        try:
            row = await run_in_threadpool(service.resume, turn_id, body, org_id=caller.org_id)
            after = await streams.start_of_round(turn_id, row.round)
        except BaseException:
            streams.release()
            raise
        return streams.respond(row, org_id=caller.org_id, after=after)
    row = await run_in_threadpool(service.resume, turn_id, body, org_id=caller.org_id)
    if wait:
        row = await service.wait(row, org_id=caller.org_id, seconds=wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)


@router.post("/{turn_id}/cancel", response_model=Turn)
async def cancel_turn(turn_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Cancel a turn that has not finished; its session is free at once."""
    row = await run_in_threadpool(gateway.turn_service.cancel, turn_id, org_id=caller.org_id)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


@router.get("/{turn_id}/trace", response_model=TurnTrace)
async def get_trace(turn_id: str, caller: Caller, gateway: Gateway) -> TurnTrace:
    """The turn's CompositionTrace: the live one while it runs, else the committed one."""
    steps = await run_in_threadpool(gateway.turn_service.trace, turn_id, org_id=caller.org_id)
    return TurnTrace(turn_id=turn_id, steps=steps)
