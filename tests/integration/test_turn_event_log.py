"""RedisTurnEventLog on a real Redis: ordered ids, resuming after an id, blocking reads, bound and lifetime."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest
import redis

from shared.errors import StateConflict
from shared.state import OutboxEvent, RedisStateStore, TurnState
from shared.state.keys import events_key
from shared.turn_events import RedisTurnEventLog, TurnEvent

pytestmark = pytest.mark.integration


def test_events_are_read_in_order_and_resumed_after_an_id(redis_client: redis.Redis) -> None:
    log = RedisTurnEventLog(redis_client, ttl_seconds=60, max_events=100)
    turn_id = f"turn_{uuid.uuid4().hex}"
    ids = [log.append(turn_id, "trace", {"seq": n}) for n in range(3)]

    everything = log.read(turn_id, after=None, block_ms=0, count=10)
    assert everything == [TurnEvent(ids[n], "trace", {"seq": n}) for n in range(3)]
    assert [e.data["seq"] for e in log.read(turn_id, after=ids[0], block_ms=0, count=10)] == [1, 2]
    assert log.read(turn_id, after=ids[2], block_ms=0, count=10) == []
    assert 0 < redis_client.ttl(events_key(turn_id)) <= 60


def test_a_blocked_read_wakes_up_for_a_new_event(redis_client: redis.Redis) -> None:
    log = RedisTurnEventLog(redis_client, ttl_seconds=60, max_events=100)
    turn_id = f"turn_{uuid.uuid4().hex}"
    last = log.append(turn_id, "trace", {"seq": 0})
    found: list[TurnEvent] = []
    reader = threading.Thread(target=lambda: found.extend(log.read(turn_id, after=last, block_ms=10_000, count=5)))
    reader.start()
    log.append(turn_id, "turn.completed", {"status": "completed"})
    reader.join(timeout=10)
    assert [e.event for e in found] == ["turn.completed"]


def test_a_long_log_is_trimmed_to_about_its_bound(redis_client: redis.Redis) -> None:
    log = RedisTurnEventLog(redis_client, ttl_seconds=60, max_events=10)
    turn_id = f"turn_{uuid.uuid4().hex}"
    for n in range(500):
        log.append(turn_id, "output_text.delta", {"delta": str(n)})
    kept = redis_client.xlen(events_key(turn_id))
    assert 10 <= kept < 500
    assert log.read(turn_id, after=None, block_ms=0, count=1000)[-1].data == {"delta": "499"}


def test_a_state_save_sends_its_unsent_trace_records_and_outbox_once_and_a_refused_save_none(
    redis_client: redis.Redis,
) -> None:
    store = RedisStateStore(redis_client, max_events=100)
    log = RedisTurnEventLog(redis_client, ttl_seconds=60, max_events=100)
    state = TurnState(turn_id=f"turn_{uuid.uuid4().hex}", session_id="s", org_id="o", user_id="u",
                      new_session=True, user_input="x", round=2)  # fmt: skip
    state.record("turn_start", at=datetime.now(UTC), step="request_handler", worker="w")
    store.save(state, ttl_seconds=60)
    stale = store.load(state.turn_id)
    assert stale is not None

    state.record("llm_call", at=datetime.now(UTC), step="llm_call", worker="w")
    state.outbox.append(OutboxEvent(event="turn.completed", data={"status": "completed"}))
    store.save(state, ttl_seconds=60)
    stale.record("llm_call", at=datetime.now(UTC), step="llm_call", worker="other")
    with pytest.raises(StateConflict):
        store.save(stale, ttl_seconds=60)

    events = log.read(state.turn_id, after=None, block_ms=0, count=10)
    assert [(e.event, e.data.get("kind"), e.round) for e in events] == [
        ("trace", "turn_start", 2), ("trace", "llm_call", 2), ("turn.completed", None, 2),
    ]  # fmt: skip
    assert events[1].data["worker"] == "w"
    assert stale.events_through == 1 and not stale.outbox  # the refused save gave its events back
    saved = store.load(state.turn_id)
    assert saved is not None and saved.events_through == 2 and not saved.outbox
    assert 0 < redis_client.ttl(events_key(state.turn_id)) <= 60
