"""Actions on an existing turn: post client tool results, cancel, read the CompositionTrace."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, StreamFlag, TurnId, WaitSeconds
from api_gateway.openapi import error_responses
from api_gateway.routes.turn_events import round_responses
from api_gateway.routes.turns import answer_round
from api_gateway.services import InvalidRequest
from shared.db.records import TurnRecord
from shared.models.trace import TurnTrace
from shared.models.turn import ToolResultsRequest, Turn, TurnHandle
from shared.turn_view import to_turn

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
    responses=round_responses(
        "With `wait`: the turn once it left `queued`/`running`, or as it stands. With `stream=true`: the "
        "events of the round the results start, as `GET /v1/turns/{turn_id}/events` sends them.",
        specific={
            **_NOT_FOUND,
            409: (
                "`turn_not_awaiting_tool_results`: the turn is not in `requires_client_tools` (it never was, "
                "its results were posted already, or it timed out)."
            ),
            422: "Also `stream` with `wait`.",
        },
    ),
)
async def post_tool_results(
    turn_id: TurnId,
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

        async def start() -> tuple[TurnRecord, str | None]:
            row = await run_in_threadpool(service.resume, turn_id, body, org_id=caller.org_id)
            return row, await streams.start_of_round(turn_id, row.round)

        return await streams.stream(start, org_id=caller.org_id)
    row = await run_in_threadpool(service.resume, turn_id, body, org_id=caller.org_id)
    return await answer_round(service, row, org_id=caller.org_id, wait=wait)


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
