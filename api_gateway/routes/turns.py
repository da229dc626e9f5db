"""``/v1/turns``: start a turn (or start it and stream its events), read it (with long-poll)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api_gateway.access_log import note_turn
from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, StreamFlag, TurnId, WaitSeconds
from api_gateway.openapi import QUOTA_EXCEEDED, error_responses
from api_gateway.routes.turn_events import round_responses
from api_gateway.services import InvalidRequest, TurnService
from api_gateway.telemetry import reserved_turn_id
from shared.db.records import TurnRecord
from shared.models.turn import Turn, TurnHandle, TurnRequest, TurnStatus
from shared.turn_view import to_turn

__all__ = ["answer_round", "router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)


@router.post(
    "",
    status_code=202,
    response_model=TurnHandle,
    operation_id="createTurn",
    summary="Start a turn",
    response_description="The turn was recorded and queued (without `wait`).",
    responses=round_responses(
        "With `wait`: the turn once it left `queued`/`running`, or as it stands. With `stream=true` (or "
        '`"stream": true`): the turn\'s events as they happen, as `GET /v1/turns/{turn_id}/events` sends them '
        "(the turn's id in `Aptix-Turn-Id`).",
        specific={
            404: "`session_not_found`: `session_id` names no session of the caller's organisation.",
            409: (
                "`session_busy`: the session has a turn that is not finished. `idempotency_key_reused`: "
                "the key was used before with another body."
            ),
            422: (
                "Also a client tool named like a server tool, an unknown `mode` for a new session, or `stream` "
                "with `wait`."
            ),
            429: QUOTA_EXCEEDED,
        },
    ),
)
async def create_turn(
    body: TurnRequest,
    caller: Caller,
    gateway: Gateway,
    request: Request,
    wait: WaitSeconds = None,
    stream: StreamFlag = False,
) -> Response:
    """Start a turn: a new session when ``session_id`` is absent, else a follow-up turn.

    With ``?stream=true`` (or ``"stream": true``) the answer is the turn's events as they happen
    (``text/event-stream``, as ``GET /v1/turns/{turn_id}/events``)."""
    service = gateway.turn_service
    turn_id = reserved_turn_id(request)
    if stream or body.stream:
        if wait:
            raise InvalidRequest(
                "a turn is either streamed or waited for: give ?stream or ?wait, not both",
                [{"loc": ["query", "wait"], "msg": "not with stream", "type": "value_error"}],
            )
        streamed = body.model_copy(update={"stream": True})

        async def start() -> tuple[TurnRecord, str | None]:
            # Run once a stream place is taken: a turn nobody can watch is not recorded.
            row = await run_in_threadpool(
                service.record, streamed, org_id=caller.org_id, user_id=caller.user_id, turn_id=turn_id
            )
            note_turn(request, row.turn_id, row.session_id)
            return row, None

        return await gateway.event_streams.stream(start, org_id=caller.org_id)
    row = await run_in_threadpool(service.record, body, org_id=caller.org_id, user_id=caller.user_id, turn_id=turn_id)
    note_turn(request, row.turn_id, row.session_id)
    return await answer_round(service, row, org_id=caller.org_id, wait=wait)


@router.get(
    "/{turn_id}",
    response_model=Turn,
    operation_id="getTurn",
    summary="Read a turn",
    response_description="The turn's state and result.",
    responses=error_responses(401, 422, 503, specific={404: "`not_found`: no such turn in the caller's organisation."}),
)
async def get_turn(turn_id: TurnId, caller: Caller, gateway: Gateway, wait: WaitSeconds = None) -> JSONResponse:
    """The turn's state and result; ``?wait=S`` long-polls until it leaves queued/running."""
    service = gateway.turn_service
    row = await run_in_threadpool(service.get, turn_id, org_id=caller.org_id)
    if wait:
        row = await service.wait(row, org_id=caller.org_id, seconds=wait)
    return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))


async def answer_round(service: TurnService, row: TurnRecord, *, org_id: str, wait: float | None) -> JSONResponse:
    """The answer to a request that started a round of ``row``'s turn and is not streamed.

    With ``wait`` (``?wait=S``) the turn once it leaves queued/running (or as it stands after S seconds);
    without it the turn's handle, ``202 Accepted``.
    """
    if wait:
        row = await service.wait(row, org_id=org_id, seconds=wait)
        return JSONResponse(to_turn(row).model_dump(mode="json", by_alias=True))
    handle = TurnHandle(turn_id=row.turn_id, session_id=row.session_id, status=TurnStatus(row.status))
    return JSONResponse(handle.model_dump(mode="json"), status_code=202)
