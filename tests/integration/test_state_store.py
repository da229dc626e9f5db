"""RedisStateStore on a real Redis: versioned saves refuse stale writers; leases belong to their holder."""

from __future__ import annotations

import uuid

import pytest
import redis

from shared.errors import StateConflict
from shared.state import Lease, RedisStateStore, Release, StepStart, TurnState
from shared.state.keys import cancel_key, claim_key, deliveries_key
from shared.state.store import DELIVERIES_SECONDS

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_client: redis.Redis) -> RedisStateStore:
    """The store on the test's own Redis database (no worker of the running system reads it)."""
    return RedisStateStore(redis_client)


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
    a, b = Lease(turn_id, "0:0:reasoner:0", "a"), Lease(turn_id, "0:0:reasoner:0", "b")
    assert store.claim(a, ttl_seconds=30)
    assert not store.claim(b, ttl_seconds=30)
    assert store.renew([b], ttl_seconds=30, alive_until=1.0) == [b]
    assert store.renew([a], ttl_seconds=30, alive_until=1.0) == []
    store.release(b)
    assert not store.claim(b, ttl_seconds=30)
    store.release(a)
    assert store.claim(b, ttl_seconds=30)


def test_one_renewal_renews_every_lease_it_is_given_and_names_the_lost_ones(store: RedisStateStore) -> None:
    turn_ids = [f"turn_{uuid.uuid4().hex}" for _ in range(5)]
    ours = [Lease(turn_id, "0:1:compose:1", "a") for turn_id in turn_ids]
    for lease in ours:
        assert store.claim(lease, ttl_seconds=5)
    store.release(ours[2])
    assert store.claim(Lease(turn_ids[2], "0:1:compose:1", "b"), ttl_seconds=5)
    assert store.renew(ours, ttl_seconds=100, alive_until=5000.0) == [ours[2]]
    ttls = [store.client.ttl(claim_key(lease.turn_id, lease.step_key)) for lease in ours]
    assert [ttl > 50 for ttl in ttls] == [True, True, False, True, True]
    assert store.alive_until(turn_ids) == {t: 5000.0 for i, t in enumerate(turn_ids) if i != 2}


def test_begin_takes_the_lease_and_returns_the_state_in_one_call(store: RedisStateStore) -> None:
    state = _state()
    store.save(state, ttl_seconds=60)
    lease = Lease(state.turn_id, "0:1:compose:1", "a")
    start = store.begin(lease, ttl_seconds=30)
    assert start.claimed and not start.cancelled
    assert start.state is not None and start.state.version == 1
    assert store.begin(Lease(state.turn_id, "0:1:compose:1", "b"), ttl_seconds=30) == StepStart(
        cancelled=False, claimed=False
    )
    # the save gives the lease back in the same call
    start.state.user_input = "saved"
    store.save(start.state, ttl_seconds=60, release=lease)
    assert store.client.get(claim_key(state.turn_id, "0:1:compose:1")) is None
    # a turn Redis does not know: the lease is taken and there is no state
    unknown = store.begin(Lease(f"turn_{uuid.uuid4().hex}", "0:0:request_handler:0", "a"), ttl_seconds=30)
    assert unknown.claimed and unknown.state is None


def test_begin_sets_the_marker_only_of_a_turn_it_has_no_state_for(store: RedisStateStore) -> None:
    queued = f"turn_{uuid.uuid4().hex}"
    store.mark_alive([queued], until=9_000_000_000.0)  # the gateway's marker of a queued turn
    assert store.begin(Lease(queued, "0:0:request_handler:0", "a"), ttl_seconds=30, alive_until=5000.0).claimed
    assert store.alive_until([queued]) == {queued: 5000.0}  # replaced, even though lower

    moving = _state()
    store.save(moving, ttl_seconds=60, alive_until=9_000_000_000.0)  # e.g. a long wait before its next step
    assert store.begin(Lease(moving.turn_id, "0:1:compose:1", "a"), ttl_seconds=30, alive_until=5000.0).claimed
    assert store.alive_until([moving.turn_id]) == {moving.turn_id: 9_000_000_000.0}  # a turn with state: untouched

    refused = f"turn_{uuid.uuid4().hex}"
    store.mark_alive([refused], until=9_000_000_000.0)
    assert store.claim(Lease(refused, "0:0:request_handler:0", "other"), ttl_seconds=30)
    assert not store.begin(Lease(refused, "0:0:request_handler:0", "a"), ttl_seconds=30, alive_until=5000.0).claimed
    assert store.alive_until([refused]) == {refused: 9_000_000_000.0}  # not begun: untouched


def test_begin_refuses_a_cancelled_turn_unless_told_not_to_check(store: RedisStateStore) -> None:
    turn_id = f"turn_{uuid.uuid4().hex}"
    store.cancel_many([turn_id], ttl_seconds=60)
    assert store.begin(Lease(turn_id, "0:2:llm_call:1", "a"), ttl_seconds=30) == StepStart(
        cancelled=True, claimed=False
    )
    assert store.client.get(claim_key(turn_id, "0:2:llm_call:1")) is None
    assert store.begin(Lease(turn_id, "0:6:persist:1", "a"), ttl_seconds=30, check_cancel=False).claimed


def test_a_save_does_not_release_a_lease_someone_else_holds(store: RedisStateStore) -> None:
    state = _state()
    assert store.claim(Lease(state.turn_id, "0:1:compose:1", "other"), ttl_seconds=30)
    store.save(state, ttl_seconds=60, release=Lease(state.turn_id, "0:1:compose:1", "me"))
    assert store.client.get(claim_key(state.turn_id, "0:1:compose:1")) == b"other"


def test_cancel_many_flags_every_turn_with_a_ttl_and_drops_their_markers(store: RedisStateStore) -> None:
    # Given more turns than one pipeline chunk, all marked in flight, and one more that stays
    turn_ids = [f"turn_{uuid.uuid4().hex}" for _ in range(1500)]
    other = f"turn_{uuid.uuid4().hex}"
    store.mark_alive([*turn_ids, other], until=1000.0)
    # When they are cancelled at once
    store.cancel_many(turn_ids, ttl_seconds=60)
    # Then each is flagged (for a while) and no longer in flight; the other is untouched
    assert all(store.is_cancelled(turn_id) for turn_id in turn_ids) and not store.is_cancelled(other)
    assert 0 < store.client.ttl(cancel_key(turn_ids[-1])) <= 60
    assert store.alive_until([*turn_ids, other]) == {other: 1000.0}


def test_save_moves_the_in_flight_marker_and_a_renewal_never_moves_it_back(store: RedisStateStore) -> None:
    state = _state()
    store.save(state, ttl_seconds=60, alive_until=1000.0)
    assert store.alive_until([state.turn_id]) == {state.turn_id: 1000.0}
    lease = Lease(state.turn_id, "0:1:compose:1", "a")
    assert store.claim(lease, ttl_seconds=30)
    store.renew([lease], ttl_seconds=30, alive_until=900.0)
    assert store.alive_until([state.turn_id]) == {state.turn_id: 1000.0}
    store.renew([lease], ttl_seconds=30, alive_until=1100.0)
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


def test_begin_counts_the_deliveries_a_save_or_a_release_ends(store: RedisStateStore) -> None:
    # Given a step begun by a worker that then died (its lease lapses: ttl 1 s)
    state = _state()
    store.save(state, ttl_seconds=60)
    step = "0:4:llm_call:1"
    assert store.begin(Lease(state.turn_id, step, "dead"), ttl_seconds=1).deliveries == 1
    # When another copy finds the lease held, it does not count; once it lapsed, the next one counts 2
    busy = store.begin(Lease(state.turn_id, step, "early"), ttl_seconds=30)
    assert not busy.claimed and busy.deliveries == 0
    store.client.delete(claim_key(state.turn_id, step))  # the lease lapsed
    live = Lease(state.turn_id, step, "live")
    second = store.begin(live, ttl_seconds=30)
    assert second.claimed and second.deliveries == 2 and second.state is not None
    assert 0 < store.client.ttl(deliveries_key(state.turn_id, step)) <= DELIVERIES_SECONDS
    # Then the save of a worker that lived ends the count; so does a release, unless the step was given up
    loaded = second.state
    store.save(loaded, ttl_seconds=60, release=live)
    assert store.client.exists(deliveries_key(state.turn_id, step)) == 0
    assert store.begin(live, ttl_seconds=30).deliveries == 1
    store.release(live)
    assert store.begin(live, ttl_seconds=30).deliveries == 1
    store.release(live, why=Release.GIVEN_UP)
    assert store.begin(live, ttl_seconds=30).deliveries == 2
    store.release(Lease(state.turn_id, step, "not-the-holder"))  # only the holder's release ends it
    assert store.client.hget(deliveries_key(state.turn_id, step), "n") == b"2"
    store.release(live, why=Release.HELD_BACK)  # this delivery did not run: uncounted, and its number kept
    held = store.begin(live, ttl_seconds=30)
    assert (held.deliveries, held.held_back_at, held.lost_alone) == (2, 2, 0)


def test_a_delivery_recorded_as_run_alone_counts_at_the_next_delivery_until_the_step_ends(
    store: RedisStateStore,
) -> None:
    # Given a step whose delivery ran alone (only the lease's holder can say so), then its worker died
    state = _state()
    store.save(state, ttl_seconds=60)
    step = "0:4:llm_call:1"
    dead = Lease(state.turn_id, step, "dead")
    assert store.begin(dead, ttl_seconds=30).lost_alone == 0
    assert not store.record_alone(Lease(state.turn_id, step, "not-the-holder"))
    assert store.record_alone(dead)
    store.client.delete(claim_key(state.turn_id, step))  # the lease lapsed
    assert not store.record_alone(dead)  # a lapsed lease records nothing
    # When the next deliveries begin (one held back), each finds it counted
    live = Lease(state.turn_id, step, "live")
    second = store.begin(live, ttl_seconds=30)
    assert (second.deliveries, second.lost_alone) == (2, 1)
    store.release(live, why=Release.HELD_BACK)
    third = store.begin(live, ttl_seconds=30)
    assert (third.deliveries, third.held_back_at, third.lost_alone) == (2, 2, 1)
    # Then a step that ends in a live worker ends that count too
    assert third.state is not None
    store.save(third.state, ttl_seconds=60, release=live)
    assert store.begin(live, ttl_seconds=30).lost_alone == 0
