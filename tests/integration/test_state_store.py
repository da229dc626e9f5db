"""RedisStateStore on a real Redis: versioned saves refuse stale writers; leases belong to their holder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from shared.errors import StateConflict
from shared.state import RedisStateStore, TurnState

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_urls: tuple[str, str]) -> Iterator[RedisStateStore]:
    yield RedisStateStore(redis.Redis.from_url(redis_urls[0]))


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
    assert not store.extend(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)
    assert store.extend(turn_id, "0:0:reasoner:0", owner="a", ttl_seconds=30)
    store.release(turn_id, "0:0:reasoner:0", owner="b")
    assert not store.claim(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)
    store.release(turn_id, "0:0:reasoner:0", owner="a")
    assert store.claim(turn_id, "0:0:reasoner:0", owner="b", ttl_seconds=30)


def test_cancel_flag_is_seen(store: RedisStateStore) -> None:
    turn_id = f"turn_{uuid.uuid4().hex}"
    assert not store.is_cancelled(turn_id)
    store.mark_cancelled(turn_id, ttl_seconds=60)
    assert store.is_cancelled(turn_id)
