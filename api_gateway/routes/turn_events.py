"""``GET /v1/turns/{turn_id}/events``: the turn's events as Server-Sent Events (``text/event-stream``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, TurnId
from api_gateway.openapi import error_responses
from api_gateway.services.event_stream import EVENT_ID_PATTERN, check_event_id
from shared.db.records import TurnRecord
from shared.models.turn import Turn

__all__ = ["EVENT_STREAM_CONTENT", "STREAMS_FULL", "round_responses", "router"]

router = APIRouter(prefix="/v1/turns", tags=["turns"], route_class=AuthenticatedRoute)

EVENT_STREAM_CONTENT: dict[str, Any] = {
    "text/event-stream": {
        "schema": {
            "description": (
                "One Server-Sent Event (the stream is a sequence of them, with comment lines such as `: keep-alive` "
                "between them while nothing happens). `data` is JSON: a trace record (`trace`), `{\"delta\": \"…\"}` "
                "(`output_text.delta`), `{\"deltas\": N}` (`output_text.reset`), or the `Turn` (`turn.*`)."
            ),
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The event's id: send it back as `Last-Event-ID` to resume."},
                "event": {
                    "type": "string",
                    "enum": [
                        "trace", "output_text.delta", "output_text.reset", "turn.requires_client_tools",
                        "turn.completed", "turn.failed", "turn.cancelled",
                    ],
                    "description": "The event's name.",
                },
                "data": {"type": "string", "contentMediaType": "application/json", "description": "The event's JSON."},
            },
            "required": ["id", "event", "data"],
        }
    }
}  # fmt: skip
"""The OpenAPI content of a ``text/event-stream`` answer."""
STREAMS_FULL = "Also: this gateway process already serves `APTIX_EVENTS_MAX_STREAMS` event streams."
"""What a 503 of an operation that streams can also mean."""


def round_responses(description: str, *, specific: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of an operation that starts a round of a turn (a new turn, or its tool results).

    It answers a ``TurnHandle`` (202), or with ``wait`` the ``Turn``, or with ``stream`` the round's
    events (200, ``description``); and 401, 413, 422 and 503 as everywhere, plus ``specific``.
    """
    ok = {"model": Turn, "description": description, "content": EVENT_STREAM_CONTENT}
    return {200: ok, **error_responses(401, 413, 422, 503, specific={**specific, 503: STREAMS_FULL})}


_EVENT_ID_SCHEMA = {"pattern": EVENT_ID_PATTERN}
"""Documents an event id's shape; ``check_event_id`` checks it (and the range of its numbers, up to 2^64 - 1)."""
_After = Annotated[
    str | None,
    Query(
        description="Start after this event id, as `Last-Event-ID` does (for clients that cannot set headers).",
        json_schema_extra=_EVENT_ID_SCHEMA,
    ),
]
_LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        description="Resume after this event id (EventSource sends it).",
        json_schema_extra=_EVENT_ID_SCHEMA,
    ),
]


@router.get(
    "/{turn_id}/events",
    response_class=Response,
    operation_id="getTurnEvents",
    summary="Follow a turn's events",
    responses={
        200: {
            "description": (
                "The turn's events after `Last-Event-ID` / `after` (else from the first), then each new one as it "
                "happens, until a final event or the pause that ends the round the turn was in."
            ),
            "content": EVENT_STREAM_CONTENT,
        },
        **error_responses(
            401,
            422,
            503,
            specific={
                404: "`not_found`: no such turn in the caller's organisation.",
                422: (
                    "`Last-Event-ID` or `after` is not an event id (`1732350000000-0`: two numbers, each at most "
                    "2^64 - 1)."
                ),
                503: STREAMS_FULL,
            },
        ),
    },
)
async def turn_events(
    turn_id: TurnId, caller: Caller, gateway: Gateway, after: _After = None, last_event_id: _LastEventId = None
) -> Response:
    """Replay the turn's events after ``Last-Event-ID`` (or ``?after=``; else all), then follow them until the
    turn ends or pauses for client tools in its current round."""
    # Both are checked (either may be refused); the header wins.
    header, query = check_event_id(last_event_id, where="Last-Event-ID"), check_event_id(after, where="after")
    position = header or query

    async def start() -> tuple[TurnRecord, str | None]:
        return await run_in_threadpool(gateway.turn_service.get, turn_id, org_id=caller.org_id), position

    return await gateway.event_streams.stream(start, org_id=caller.org_id)
