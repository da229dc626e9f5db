"""Turn events: the ordered log of what happens in a turn, as clients watch it (``GET /v1/turns/{id}/events``).

Workers append events as they happen (trace records, model text deltas, pending client tool calls,
the final status); any gateway replica replays and follows them. The events a step's state holds
(its trace records, its pause or final status) are appended by the state store's save, atomically
with the state (``shared.state.store``); :meth:`TurnEventLog.append` is for the others (text deltas
while the model writes, a cancel on the gateway). In production the log is a Redis
Stream per turn (:class:`RedisTurnEventLog`): ordered ids a client can resume after, a bounded
length, and the same lifetime as the turn's state. :class:`MemoryTurnEventLog` is the same log in
one process, for unit tests.

Appending only writes (``XADD``): a slow reader never holds up the worker that appends.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from shared.db.records import TurnRecord
from shared.models.turn import TurnStatus
from shared.state.keys import events_key
from shared.state.store import event_json
from shared.turn_view import to_turn, turn_json

__all__ = [
    "FINAL_EVENTS",
    "PAUSE_EVENT",
    "ROUND_END_EVENTS",
    "MemoryTurnEventLog",
    "RedisTurnEventLog",
    "TurnEvent",
    "TurnEventLog",
    "append_ended",
    "parse_entries",
]

logger = logging.getLogger(__name__)

PAUSE_EVENT = "turn.requires_client_tools"
"""Ends a round whose model called client tools; data: the turn, with its ``pending_tool_calls``."""
ROUND_END_EVENTS: dict[TurnStatus, str] = {
    TurnStatus.REQUIRES_CLIENT_TOOLS: PAUSE_EVENT,
    TurnStatus.COMPLETED: "turn.completed",
    TurnStatus.FAILED: "turn.failed",
    TurnStatus.CANCELLED: "turn.cancelled",
}
"""The event that ends a round, by the status the turn reached; its data is the turn as ``GET`` shows it."""
FINAL_EVENTS = frozenset(ROUND_END_EVENTS[status] for status in TurnStatus.terminal())
"""The events after which a turn has no more."""


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One event of a turn, as the log returns it."""

    event_id: str
    """Its id in the turn's log (a Redis Stream id such as ``1732350000000-0``); ids increase."""
    event: str
    """Its name: ``trace``, ``output_text.delta``, ``turn.requires_client_tools``, ``turn.completed``, ..."""
    data: dict[str, Any]
    """Its JSON payload."""
    round: int | None = None
    """The turn's round (0, then one more per tool-results re-entry) for the events a state save sent;
    None for the others. Internal: it tells which round a ``turn.requires_client_tools`` ends."""


class TurnEventLog(Protocol):
    """The events of every turn, each turn's in order."""

    def append(self, turn_id: str, event: str, data: Mapping[str, Any]) -> str:
        """Append one event to the turn's log.

        Args:
            turn_id: the turn.
            event: the event's name.
            data: its JSON-serialisable payload.

        Returns:
            The new event's id.
        """

    def read(self, turn_id: str, *, after: str | None, block_ms: int, count: int) -> list[TurnEvent]:
        """The turn's events after ``after`` (from the first when None), oldest first.

        Args:
            turn_id: the turn.
            after: the id of the last event the reader has; None for all.
            block_ms: when there are none yet, wait up to this long for one (0: do not wait).
            count: at most this many.

        Returns:
            The events, possibly none.
        """

    def latest(self, turn_id: str, *, before: str | None, count: int) -> list[TurnEvent]:
        """The turn's newest events before ``before`` (from the newest when None), newest first.

        Args:
            turn_id: the turn.
            before: the id of the oldest event the reader has read this way; None for the newest.
            count: at most this many.

        Returns:
            The events, possibly none.
        """


class RedisTurnEventLog:
    """The log as one Redis Stream per turn, trimmed to about ``max_events`` and kept ``ttl_seconds``."""

    def __init__(self, client: redis.Redis, *, ttl_seconds: int, max_events: int) -> None:
        """Keep turns' logs on ``client``.

        Args:
            client: the Redis connection pool (the state store's).
            ttl_seconds: how long a turn's log lives after its last event: the turn state's lifetime.
            max_events: about how many events a turn's log keeps (``MAXLEN ~``); older ones go first.
        """
        self.client = client
        self.ttl_seconds = ttl_seconds
        self.max_events = max_events

    def append(self, turn_id: str, event: str, data: Mapping[str, Any]) -> str:
        key = events_key(turn_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(key, {"event": event, "data": event_json(data)}, maxlen=self.max_events, approximate=True)
        pipe.expire(key, self.ttl_seconds)
        event_id, _ = pipe.execute()
        return _text(event_id)

    def read(self, turn_id: str, *, after: str | None, block_ms: int, count: int) -> list[TurnEvent]:
        key = events_key(turn_id)
        # RESP2 replies [[key, entries]]; the typing also allows RESP3's {key: [entries]}, which we do not ask for.
        found: Any = self.client.xread({key: after or "0-0"}, count=count, block=block_ms if block_ms > 0 else None)
        return parse_entries(found[0][1]) if found else []

    def latest(self, turn_id: str, *, before: str | None, count: int) -> list[TurnEvent]:
        newest = "+" if before is None else f"({before}"
        found: Any = self.client.xrevrange(events_key(turn_id), max=newest, min="-", count=count)
        return parse_entries(found)


class MemoryTurnEventLog:
    """A thread-safe in-memory TurnEventLog with Redis-like ids (``<sequence>-0``)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._events: dict[str, list[TurnEvent]] = {}
        self._sequence = 0

    def append(self, turn_id: str, event: str, data: Mapping[str, Any]) -> str:
        with self._changed:
            self._sequence += 1
            event_id = f"{self._sequence}-0"
            self._events.setdefault(turn_id, []).append(TurnEvent(event_id, event, json.loads(json.dumps(data))))
            self._changed.notify_all()
        return event_id

    def extend(self, turn_id: str, events: Sequence[tuple[str, str]], *, round_: int) -> None:
        """Append (name, JSON data) events a state save sent (``shared.state.store.EventSink``)."""
        with self._changed:
            for name, data in events:
                self._sequence += 1
                item = TurnEvent(f"{self._sequence}-0", name, json.loads(data), round_)
                self._events.setdefault(turn_id, []).append(item)
            self._changed.notify_all()

    def read(self, turn_id: str, *, after: str | None, block_ms: int, count: int) -> list[TurnEvent]:
        with self._changed:
            found = self._after(turn_id, after)
            if not found and block_ms > 0:
                self._changed.wait_for(lambda: bool(self._after(turn_id, after)), timeout=block_ms / 1000)
                found = self._after(turn_id, after)
        return found[:count]

    def latest(self, turn_id: str, *, before: str | None, count: int) -> list[TurnEvent]:
        with self._changed:
            events = self._events.get(turn_id, [])
            if before is not None:
                events = [item for item in events if _order(item.event_id) < _order(before)]
            return list(reversed(events))[:count]

    def events(self, turn_id: str) -> list[TurnEvent]:
        """Every event of the turn (for assertions)."""
        with self._changed:
            return list(self._events.get(turn_id, []))

    def _after(self, turn_id: str, after: str | None) -> list[TurnEvent]:
        events = self._events.get(turn_id, [])
        if after is None:
            return list(events)
        mark = _order(after)
        return [item for item in events if _order(item.event_id) > mark]


def append_ended(log: TurnEventLog, record: TurnRecord) -> None:
    """Append the event of a turn ended outside the pipeline (cancelled, timed out, given up on).

    The database already says how the turn ended: a Redis that does not answer only costs the event,
    which a gateway following the turn then writes itself (``api_gateway.event_stream``).

    Args:
        log: the turns' event logs.
        record: the turn as ``TurnRepository.finish_early`` ended it.
    """
    try:
        log.append(record.turn_id, ROUND_END_EVENTS[record.status], turn_json(to_turn(record)))
    except redis.RedisError as exc:
        logger.warning("could not append the %s event of turn %s: %s", record.status.value, record.turn_id, exc)


def parse_entries(entries: list[tuple[Any, dict[Any, Any]]]) -> list[TurnEvent]:
    """Turn events from Redis Stream entries (``XREAD``/``XRANGE`` replies, bytes or text)."""
    events = []
    for entry_id, fields in entries:
        values = {_text(name): _text(value) for name, value in fields.items()}
        round_ = int(values["round"]) if "round" in values else None
        events.append(TurnEvent(_text(entry_id), values["event"], json.loads(values["data"]), round_))
    return events


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _order(event_id: str) -> tuple[int, int]:
    millis, _, sequence = event_id.partition("-")
    return int(millis), int(sequence or 0)
