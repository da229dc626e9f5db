"""``/v1/turns``: start a turn, read it (with long-poll)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, StreamFlag, WaitSeconds
from api_gateway.routes.turn_events import STREAMED_OR_TURN
from api_gateway.services import InvalidRequest
from shared.models.turn import Turn, TurnHandle, TurnRequest, TurnStatus
from shared.turn_view import to_turn

__all__ = ["router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)


@router.post(
    "",
    status_code=202,
    response_model=TurnHandle,
    responses=STREAMED_OR_TURN,
)
async def create_turn(
    body: TurnRequest, caller: Caller, gateway: Gateway, wait: WaitSeconds = None, stream: StreamFlag = False
) -> Response:
    """Start a turn: a new session when ``session_id`` is absent, else a follow-up turn.

    With ``?stream=true`` (or ``"stream": true``) the answer is the turn's events as they happen
    (``text/event-stream``, as ``GET /v1/turns/{turn_id}/events``)."""
    service = gateway.turn_service
    if stream or body.stream:
        if wait:
            raise InvalidRequest(
                "a turn is either streamed or waited for: give ?stream or ?wait, not both",
                [{"loc": ["query", "wait"], "msg": "not with stream", "type": "value_error"}],
            )
        streams = gateway.event_streams
        streams.reserve()  # before recording: a turn nobody can watch is not started
        try:
            row = await run_in_threadpool(
                service.record, body.model_copy(update={"stream": True}), org_id=caller.org_id, user_id=caller.user_id
            )
        except BaseException:
            streams.release()
            raise
        return streams.respond(row, org_id=caller.org_id, after=None)
    row = await run_in_threadpool(service.record, body, org_id=caller.org_id, user_id=caller.user_id)
    if wait:
        row = await service.wait(row, org_id=caller.org_id, seconds=wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)


@router.get("/{turn_id}", response_model=Turn)
async def get_turn(turn_id: str, caller: Caller, gateway: Gateway, wait: WaitSeconds = None) -> JSONResponse:
    """The turn's state and result; ``?wait=S`` long-polls until it leaves queued/running."""
    service = gateway.turn_service
    row = await run_in_threadpool(service.get, turn_id, org_id=caller.org_id)
    if wait:
        row = await service.wait(row, org_id=caller.org_id, seconds=wait)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
