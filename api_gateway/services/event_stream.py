"""EventStreams: a turn's events as Server-Sent Events, replayed and followed from its event log in Redis.

Any gateway replica serves any turn: a stream reads the turn's Redis Stream (``shared.turn_events``),
never this process's memory. It replays the events after the client's position (``Last-Event-ID``,
else ``?after=``, else from the first), then follows new ones with ``XREAD BLOCK`` on an asyncio Redis
connection of its own, so one stream never holds up the event loop and a slow client only holds up
its own stream (workers only ``XADD``). Each event goes out with its log id as ``id:``; a stream
with nothing to send for ``APTIX_EVENTS_KEEPALIVE_SECONDS`` sends a comment line so proxies keep it open.

A stream ends after a final event (``turn.completed``, ``turn.failed``, ``turn.cancelled``) or after
the ``turn.requires_client_tools`` that ends the round the turn was in when the stream began; pauses
of earlier rounds are replayed like any event. A turn whose database record says it ended (or paused)
while its log shows no such event (the worker or gateway that ended it stopped before appending, Redis
lost the log, the log expired) gets the event appended here, from the record, once the record is a
few seconds old: every stream of an ended turn ends. The record is read when the stream begins and
then, while nothing comes, at each keep-alive of a turn whose in-flight marker lapsed (a turn that
moves has a marker ahead of now, so a stream of a running turn costs no database read).

At most ``APTIX_EVENTS_MAX_STREAMS`` streams run at once in a process; one more is refused
(``Unavailable``, 503) before anything is recorded. A Redis that stops answering mid-stream ends the
stream (the client resumes with ``Last-Event-ID``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import redis
import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from api_gateway.services.errors import InvalidRequest, NotFound, Unavailable
from api_gateway.services.turn_service import TurnService
from api_gateway.sse import EventStreamResponse
from shared.db.records import TurnRecord
from shared.models.turn import TurnStatus
from shared.state.keys import alive_key, events_key
from shared.state.store import event_json
from shared.turn_events import FINAL_EVENTS, PAUSE_EVENT, ROUND_END_EVENTS
from shared.turn_view import to_turn, turn_json

__all__ = ["EVENT_ID_PATTERN", "REPAIR_AFTER_SECONDS", "EventStreams", "check_event_id"]

logger = logging.getLogger(__name__)

REPAIR_AFTER_SECONDS = 5.0
"""How old a record of an ended turn must be before a stream appends the event its log lacks: the worker
that ended it commits first and appends just after."""
_BATCH = 200
"""Events read per ``XREAD``."""
EVENT_ID_PATTERN = r"^([0-9]{1,20}(-[0-9]{1,20})?)?$"
"""The shape of a position: an event id (a Redis stream id: ``1732350000000-0``), or empty (the same as none),
as a JSON Schema ``pattern``."""
_EVENT_ID = re.compile(EVENT_ID_PATTERN)  # fullmatch: "$" alone would let a trailing newline through
_MAX_ID_PART = 2**64 - 1
"""The largest time or sequence part of a Redis stream id (each is an unsigned 64-bit number)."""
_FINAL = tuple(name.encode() for name in sorted(FINAL_EVENTS))
_PAUSE = PAUSE_EVENT.encode()
_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
# The id of the log's last event when it ends the round (ARGV[1], of round ARGV[3] for a pause);
# else, when ARGV[7] allows it, append that event and return its id; else nil. Concurrent streams
# (on any replica) repairing the same turn append it once.
_APPEND_ONCE = """
local last = redis.call('xrevrange', KEYS[1], '+', '-', 'COUNT', 1)
if #last > 0 then
  local fields, event, round = last[1][2], nil, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'event' then event = fields[i + 1] elseif fields[i] == 'round' then round = fields[i + 1] end
  end
  if event == ARGV[1] and (ARGV[1] ~= ARGV[6] or round == ARGV[3]) then return last[1][1] end
end
if ARGV[7] ~= '1' then return false end
local id = redis.call('xadd', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[1], 'data', ARGV[2], 'round', ARGV[3])
redis.call('expire', KEYS[1], ARGV[4])
return id
"""


def check_event_id(value: str | None, *, where: str) -> str | None:
    """``value`` when it is an event id a client may resume after (``1732350000000-0``), None when absent.

    An event id is a Redis stream id: a time and an optional sequence number, each at most 2^64 - 1
    (Redis refuses a larger one as an invalid stream id).

    Raises:
        InvalidRequest: it is not such an id.
    """
    if value is None or value == "":
        return None
    if not _EVENT_ID.fullmatch(value) or any(int(part) > _MAX_ID_PART for part in value.split("-")):
        raise InvalidRequest(
            f"{where} must be the id of an event of this stream (such as 1732350000000-0), not {value[:64]!r}",
            [{"loc": [where], "msg": "not an event id", "type": "value_error"}],
        )
    return value


class EventStreams:
    """The event streams of one gateway process: how many run, and each one's replay and follow loop."""

    def __init__(
        self,
        *,
        client: aioredis.Redis,
        turns: TurnService,
        max_streams: int,
        keepalive_seconds: float,
        ttl_seconds: int,
        max_events: int,
        clock: Callable[[], datetime],
    ) -> None:
        """Serve streams from ``client`` (a pool with a connection for each stream).

        Args:
            client: asyncio Redis on the state store's database.
            turns: reads a turn's record when its log may lack the event that ends it.
            max_streams: streams at once (``APTIX_EVENTS_MAX_STREAMS``).
            keepalive_seconds: idle time after which a comment line goes out (``APTIX_EVENTS_KEEPALIVE_SECONDS``).
            ttl_seconds: the lifetime of a turn's log (the turn state's), for events appended here.
            max_events: about how many events a turn's log keeps.
            clock: the gateway's clock.
        """
        self._client = client
        self._turns = turns
        self._max_streams = max_streams
        self._keepalive_ms = max(1, int(keepalive_seconds * 1000))
        self._ttl_seconds = ttl_seconds
        self._max_events = max_events
        self._clock = clock
        self._append_once = client.register_script(_APPEND_ONCE)
        self.open = 0
        """Streams running now."""

    async def stream(
        self, start: Callable[[], Awaitable[tuple[TurnRecord, str | None]]], *, org_id: str
    ) -> StreamingResponse:
        """Take one of this process's stream places, run ``start`` and answer with the events it names.

        The response gives its place back when it ends, however it ends; so does a ``start`` that
        raises. The first events are read before answering: a Redis that does not answer is a 503,
        not a stream cut at once.

        Args:
            start: records, resumes or reads the caller's turn; returns it (as it stands when the stream
                begins: its round is the one the stream ends with) and the id of the last event the
                client has (None: every event).
            org_id: the caller's organisation.

        Returns:
            The ``text/event-stream`` response, with the turn's and session's ids in ``Aptix-Turn-Id``
            and ``Aptix-Session-Id``.

        Raises:
            Unavailable: this process already serves ``APTIX_EVENTS_MAX_STREAMS`` streams.
        """
        if self.open >= self._max_streams:
            raise Unavailable(
                f"this gateway process already serves {self._max_streams} event streams (APTIX_EVENTS_MAX_STREAMS)"
            )
        self.open += 1
        try:
            record, after = await start()
            last = after or "0-0"
            first = await self._read(events_key(record.turn_id), last, wait=None)
        except BaseException:
            self.open -= 1
            raise
        headers = {**_HEADERS, "Aptix-Turn-Id": record.turn_id, "Aptix-Session-Id": record.session_id}
        frames = self._frames(record, org_id=org_id, last=last, first=first)
        return EventStreamResponse(frames, headers=headers, on_end=self._give_back)

    async def close(self) -> None:
        """Close the Redis connections (the gateway is stopping)."""
        await self._client.aclose()

    async def start_of_round(self, turn_id: str, round_: int) -> str | None:
        """The id of the event that ended round ``round_ - 1`` (its pause): round ``round_`` follows it.

        Returns:
            That id; None when the log does not hold it (the stream then starts from the first event).
        """
        entries: Any = await self._client.xrevrange(events_key(turn_id), count=_BATCH)
        for entry_id, fields in entries:
            if fields.get(b"event") == _PAUSE and fields.get(b"round") == str(round_ - 1).encode():
                return str(entry_id.decode())
        return None

    async def _frames(self, record: TurnRecord, *, org_id: str, last: str, first: list[Any]) -> AsyncIterator[bytes]:
        key = events_key(record.turn_id)
        entries, wait = first, None  # the replay did not wait: an ended turn whose log lacks its end is seen at once
        known: TurnRecord | None = record
        try:
            while True:
                frames = []
                for entry_id, fields in entries:
                    last = entry_id.decode()
                    frames.append(b"id: %s\nevent: %s\ndata: %s\n\n" % (entry_id, fields[b"event"], fields[b"data"]))
                    if _ends(fields, record.round):
                        yield b"".join(frames)
                        return
                if frames:
                    yield b"".join(frames)
                if len(entries) < _BATCH and not (entries and wait is not None):
                    if wait is not None:
                        yield b": keep-alive\n\n"
                    if known is not None or not await self._moving(record.turn_id):
                        ended = await self._repair(known, record.turn_id, org_id=org_id, round_=record.round)
                        if ended is not None and _order(ended) <= _order(last):
                            return  # the client already has the event that ends the round: nothing more comes
                    known, wait = None, self._keepalive_ms
                entries = await self._read(key, last, wait=wait)
        except (redis.RedisError, SQLAlchemyError) as exc:
            # The client resumes after the last event it got (Last-Event-ID), on this gateway or another.
            logger.warning("event stream of turn %s cut: %s: %s", record.turn_id, type(exc).__name__, exc)

    async def _read(self, key: str, last: str, *, wait: int | None) -> list[Any]:
        reply: Any = await self._client.xread({key: last}, count=_BATCH, block=wait)
        return list(reply[0][1]) if reply else []

    def _give_back(self) -> None:
        self.open -= 1

    async def _moving(self, turn_id: str) -> bool:
        """Whether the turn's in-flight marker vouches for it: a turn that moves has not ended, and its
        record need not be read (every state save and lease renewal pushes the marker forward)."""
        until = await self._client.get(alive_key(turn_id))
        return until is not None and float(until) > self._clock().timestamp()

    async def _repair(self, record: TurnRecord | None, turn_id: str, *, org_id: str, round_: int) -> str | None:
        """The id of the event that ends ``round_`` when the turn's record (read now when None) says the round
        ended: the log's last event when it is that one, else one appended now from the record (once the
        record is :data:`REPAIR_AFTER_SECONDS` old); None while the round goes on."""
        if record is None:
            try:
                record = await run_in_threadpool(self._turns.get, turn_id, org_id=org_id)
            except NotFound:
                return None
        status = TurnStatus(record.status)
        if not (status.is_terminal or (status is TurnStatus.REQUIRES_CLIENT_TOOLS and record.round >= round_)):
            return None
        settled = (self._clock() - record.updated_at).total_seconds() >= REPAIR_AFTER_SECONDS
        args: list[str | int] = [
            ROUND_END_EVENTS[status], event_json(turn_json(to_turn(record))), record.round, self._ttl_seconds,
            self._max_events, PAUSE_EVENT, "1" if settled else "0",
        ]  # fmt: skip
        found: Any = await self._append_once(keys=[events_key(turn_id)], args=args)
        return None if found is None else (found.decode() if isinstance(found, bytes) else str(found))


def _ends(fields: dict[bytes, bytes], round_: int) -> bool:
    event = fields[b"event"]
    if event in _FINAL:
        return True
    return event == _PAUSE and int(fields.get(b"round", b"0")) >= round_


def _order(event_id: str) -> tuple[int, int]:
    millis, _, sequence = event_id.partition("-")
    return int(millis), int(sequence or 0)
