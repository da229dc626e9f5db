"""RedisTurnEventLog on a real Redis: ordered ids, resuming after an id, blocking reads, bound and lifetime."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from shared.state.keys import events_key
from shared.turn_events import RedisTurnEventLog, TurnEvent
from tests.conftest import claim_redis_databases
from tests.services_check import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(services: None) -> Iterator[redis.Redis]:
    """A Redis database of its own: no worker of the running system reads these keys."""
    (index,) = claim_redis_databases(1, uuid.uuid4().hex)
    client = redis.Redis.from_url(f"{redis_url().rstrip('/')}/{index}")
    yield client
    client.flushdb()


def test_events_are_read_in_order_and_resumed_after_an_id(client: redis.Redis) -> None:
    log = RedisTurnEventLog(client, ttl_seconds=60, max_events=100)
    turn_id = f"turn_{uuid.uuid4().hex}"
    ids = [log.append(turn_id, "trace", {"seq": n}) for n in range(3)]

    everything = log.read(turn_id, after=None, block_ms=0, count=10)
    assert everything == [TurnEvent(ids[n], "trace", {"seq": n}) for n in range(3)]
    assert [e.data["seq"] for e in log.read(turn_id, after=ids[0], block_ms=0, count=10)] == [1, 2]
    assert log.read(turn_id, after=ids[2], block_ms=0, count=10) == []
    assert 0 < client.ttl(events_key(turn_id)) <= 60


def test_a_blocked_read_wakes_up_for_a_new_event(client: redis.Redis) -> None:
    log = RedisTurnEventLog(client, ttl_seconds=60, max_events=100)
    turn_id = f"turn_{uuid.uuid4().hex}"
    last = log.append(turn_id, "trace", {"seq": 0})
    found: list[TurnEvent] = []
    reader = threading.Thread(target=lambda: found.extend(log.read(turn_id, after=last, block_ms=10_000, count=5)))
    reader.start()
    log.append(turn_id, "turn.completed", {"status": "completed"})
    reader.join(timeout=10)
    assert [e.event for e in found] == ["turn.completed"]


def test_a_long_log_is_trimmed_to_about_its_bound(client: redis.Redis) -> None:
    log = RedisTurnEventLog(client, ttl_seconds=60, max_events=10)
    turn_id = f"turn_{uuid.uuid4().hex}"
    for n in range(500):
        log.append(turn_id, "output_text.delta", {"delta": str(n)})
    kept = client.xlen(events_key(turn_id))
    assert 10 <= kept < 500
    assert log.read(turn_id, after=None, block_ms=0, count=1000)[-1].data == {"delta": "499"}
