"""RedisStateStore on a real Redis: versioned saves refuse stale writers; leases belong to their holder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from shared.errors import StateConflict
from shared.state import RedisStateStore, TurnState
from tests.conftest import claim_redis_databases
from tests.services_check import redis_url

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store(services: None) -> Iterator[RedisStateStore]:
    """A Redis database of its own: no worker of the running system reads these keys."""
    (index,) = claim_redis_databases(1, uuid.uuid4().hex)
    client = redis.Redis.from_url(f"{redis_url().rstrip('/')}/{index}")
    yield RedisStateStore(client)
    client.flushdb()


def _state() -> TurnState:
    return TurnState(
        turn_id=f"turn_{uuid.uuid4().hex}", session_id="s", org_id="o", user_id="u", new_session=True, user_input="x"
    )


def test_save_from_a_stale_copy_is_refused(store: RedisStateStore) -> None:
    state = _state()
    store.save(state, ttl_seconds=60)
    first = store.load(state.turn_id)
    second = store.load(state.turn_id)
    assert first is not None and second is not None
    first.user_input = "first writer"
    store.save(first, ttl_seconds=60)
    second.user_input = "second writer"
    with pytest.raises(StateConflict):
        store.save(second, ttl_seconds=60)
    assert second.version == 1
    loaded = store.load(state.turn_id)
    assert loaded is not None and loaded.user_input == "first writer" and loaded.version == 2


def test_lease_is_held_renewed_and_released_only_by_its_owner(store: RedisStateStore) -> None:
    turn_id = f"turn_{uuid.uuid4().hex}"
    assert store.claim(turn_id, "0:0:reasoner:0", owner="a", ttl_seconds=30)
    assert not store.claim(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)
    assert not store.extend(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30, alive_until=1.0)
    assert store.extend(turn_id, "0:0:reasoner:0", owner="a", ttl_seconds=30, alive_until=1.0)
    store.release(turn_id, "0:0:reasoner:0", owner="b")
    assert not store.claim(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)
    store.release(turn_id, "0:0:reasoner:0", owner="a")
    assert store.claim(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)


def test_cancel_flag_is_seen(store: RedisStateStore) -> None:
    turn_id = f"turn_{uuid.uuid4().hex}"
    assert not store.is_cancelled(turn_id)
    store.mark_cancelled(turn_id, ttl_seconds=60)
    assert store.is_cancelled(turn_id)


def test_save_moves_the_in_flight_marker_and_a_renewal_never_moves_it_back(store: RedisStateStore) -> None:
    state = _state()
    store.save(state, ttl_seconds=60, alive_until=1000.0)
    assert store.alive_until([state.turn_id]) == {state.turn_id: 1000.0}
    assert store.claim(state.turn_id, "0:1:compose:1", owner="a", ttl_seconds=30)
    store.extend(state.turn_id, "0:1:compose:1", owner="a", ttl_seconds=30, alive_until=900.0)
    assert store.alive_until([state.turn_id]) == {state.turn_id: 1000.0}
    store.extend(state.turn_id, "0:1:compose:1", owner="a", ttl_seconds=30, alive_until=1100.0)
    assert store.alive_until([state.turn_id]) == {state.turn_id: 1100.0}
    store.save(state, ttl_seconds=60, alive_until=None)  # the chain ended
    assert store.alive_until([state.turn_id]) == {}


def test_parked_envelopes_are_handed_out_once_when_due(store: RedisStateStore) -> None:
    store.park('{"a": 1}', due=100.0)
    store.park('{"b": 2}', due=200.0)
    assert store.pop_due(now=50.0) == []
    assert store.pop_due(now=150.0) == ['{"a": 1}']
    assert store.pop_due(now=150.0) == []
    assert store.pop_due(now=250.0) == ['{"b": 2}']
