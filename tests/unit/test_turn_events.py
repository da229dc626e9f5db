"""MemoryTurnEventLog: the turn event log's semantics in one process (the Redis log is tested on Redis)."""

from __future__ import annotations

import threading

from shared.turn_events import MemoryTurnEventLog, TurnEvent


def test_read_returns_a_turns_events_in_order_after_the_given_id() -> None:
    log = MemoryTurnEventLog()
    first = log.append("t1", "trace", {"kind": "turn_start"})
    log.append("t2", "trace", {"kind": "other turn"})
    second = log.append("t1", "turn.completed", {"status": "completed"})

    assert log.read("t1", after=None, block_ms=0, count=10) == [
        TurnEvent(first, "trace", {"kind": "turn_start"}),
        TurnEvent(second, "turn.completed", {"status": "completed"}),
    ]
    assert [e.event_id for e in log.read("t1", after=first, block_ms=0, count=10)] == [second]
    assert log.read("t1", after=second, block_ms=0, count=10) == []
    assert len(log.read("t1", after=None, block_ms=0, count=1)) == 1


def test_a_blocked_read_returns_the_event_appended_while_it_waits() -> None:
    log = MemoryTurnEventLog()
    found: list[TurnEvent] = []
    reader = threading.Thread(target=lambda: found.extend(log.read("t", after=None, block_ms=10_000, count=5)))
    reader.start()
    log.append("t", "trace", {"n": 1})
    reader.join(timeout=10)
    assert [e.data for e in found] == [{"n": 1}]
