"""``GET /v1/turns/{turn_id}/events``: the turn's events as Server-Sent Events (``text/event-stream``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.services.event_stream import check_event_id
from shared.models.turn import Turn

__all__ = ["EVENT_STREAM_RESPONSE", "STREAMED_OR_TURN", "router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)

EVENT_STREAM_RESPONSE: dict[str, Any] = {
    "description": "The turn's events: `id:`, `event:` and `data:` (JSON) per event; comment lines keep it open.",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
"""The OpenAPI description of a ``text/event-stream`` answer."""
STREAMED_OR_TURN: dict[int | str, dict[str, Any]] = {
    200: {
        "model": Turn,
        "description": "The `Turn` (with `?wait`), or its events (`text/event-stream`, with `?stream=true`).",
        "content": EVENT_STREAM_RESPONSE["content"],
    }
}
"""The OpenAPI description of a 200 that is a ``Turn`` when waited for and events when streamed."""
_After = Annotated[
    str | None, Query(description="Start after this event id (for clients that cannot send Last-Event-ID).")
]
_LastEventId = Annotated[
    str | None, Header(alias="Last-Event-ID", description="Resume after this event id (EventSource sends it).")
]


@router.get("/{turn_id}/events", response_class=Response, responses={200: EVENT_STREAM_RESPONSE})
async def turn_events(
    turn_id: str,
    caller: Caller,
    gateway: Gateway,
    after: _After = None,
    last_event_id: _LastEventId = None,
) -> Response:
    """Replay the turn's events after ``Last-Event-ID`` (or ``?after=``; else all), then follow them until the
    turn ends or pauses for client tools in its current round."""
    position = check_event_id(last_event_id, where="Last-Event-ID") or check_event_id(after, where="after")
    streams = gateway.event_streams
    streams.reserve()
    try:
        row = await run_in_threadpool(gateway.turn_service.get, turn_id, org_id=caller.org_id)
    except BaseException:
        streams.release()
        raise
    return streams.respond(row, org_id=caller.org_id, after=position)
