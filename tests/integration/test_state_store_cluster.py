"""The state store on a real Redis Cluster (three primaries, a replica each, started by this module): every
operation of every port of ``shared.state.store``, the admission books, the limiter, the breaker, the leader
lease and the event log, each multi-key script on the cluster; then turns end to end with the state store
on the cluster and the broker on a plain Redis.

A cross-slot script or transaction fails on a cluster (``CROSSSLOT``, or redis-py refusing it), so an
operation that passes here touches one slot per script.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import redis

from scripted_llm import ScriptedServer
from shared.errors import StateConflict
from shared.state import Lease, RedisStateStore, Release, TurnState
from shared.state import store as ports
from shared.state.admission import AdmissionQueue
from shared.state.keys import RECONCILER_LEADER_KEY, state_key
from shared.state.leader import LeaderLease
from shared.state.redis_store import connect
from shared.state.scripts import pipelined
from shared.state.token_usage import TokenUsage, TurnTokens, merge_calls
from shared.turn_events import RedisTurnEventLog
from tests.conftest import redis_databases
from tests.integration.conftest import System, start_system
from tests.support.redis_cluster import LocalRedisCluster
from tests.support.waiting import wait_for
from workers.llm.breaker import CircuitBreaker, breaker_key
from workers.llm.limiter import Limits, RateLimiter, limiter_keys

pytestmark = pytest.mark.integration

PORTS = (ports.TurnStates, ports.StepLeases, ports.CancelFlags, ports.InFlightMarkers, ports.Timers)
EXERCISED = {
    "load", "begin", "save", "drop", "claim", "renew", "release", "record_alone", "cancel_many", "is_cancelled",
    "mark_alive", "alive_until", "forget", "forget_all", "prune_markers", "park", "pop_due",
}  # fmt: skip
"""The operations :func:`test_every_state_store_operation_runs_on_the_cluster` runs."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """Three primaries with a replica each on loopback, for this module; every node ended at the end."""
    local = LocalRedisCluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    try:
        local.start()
        yield local
    finally:
        local.stop()


@pytest.fixture
def client(cluster: LocalRedisCluster) -> Iterator[redis.Redis]:
    """The state store's client of the cluster, as ``APTIX_REDIS_URL=redis+cluster://…`` builds it."""
    state = connect(cluster.url, max_connections=16)
    yield state
    state.close()


def _state(org: str = "org-a") -> TurnState:
    return TurnState(
        turn_id=f"turn_{uuid.uuid4().hex}", session_id="s", org_id=org, user_id="u", new_session=True, user_input="x"
    )


def _nodes(client: redis.Redis, keys: list[str]) -> set[str]:
    """The primaries (host:port) serving ``keys``."""
    cluster_client = client  # a RedisCluster under the redis.Redis type the store takes
    return {cluster_client.get_node_from_key(key).name for key in keys}  # type: ignore[attr-defined]


def _spanning_states(client: redis.Redis, count: int) -> list[TurnState]:
    """``count`` fresh turns whose state keys sit on at least two primaries (random ids all land on one
    primary about once in 240 draws of six, so the last is drawn again until they do not)."""
    states = [_state() for _ in range(count)]
    while len(_nodes(client, [state_key(state.turn_id) for state in states])) < 2:
        states[-1] = _state()
    return states


def test_every_state_store_operation_runs_on_the_cluster(client: redis.Redis) -> None:
    operations = {name for port in PORTS for name, _ in inspect.getmembers(port, inspect.isfunction)}
    assert {name for name in operations if not name.startswith("_")} == EXERCISED
    store = RedisStateStore(client, max_events=100)
    states = _spanning_states(client, 6)

    # begin with no state: the lease is taken, the delivery counted, the marker set
    first = states[0]
    lease = Lease(first.turn_id, "0:1:compose:1", "w1")
    start = store.begin(lease, ttl_seconds=30, alive_until=2e9)
    assert (start.claimed, start.state, start.deliveries) == (True, None, 1)
    assert store.alive_until([first.turn_id]) == {first.turn_id: 2e9}
    assert not store.claim(Lease(first.turn_id, "0:1:compose:1", "w2"), ttl_seconds=30)
    # save with events, the lease given back, the turn leaving admission and its tokens merged (other slots, one
    # pipeline)
    tokens = TurnTokens("org-t", date(2026, 11, 25), first.turn_id, 42)
    store.save(first, ttl_seconds=60, alive_until=2e9 + 1, release=lease, leave_admission=True, tokens=tokens)
    loaded = store.load(first.turn_id)
    assert loaded is not None and loaded.version == 1
    assert TokenUsage(client).spent("org-t", tokens.day, seed=lambda: {"turn_old": 8}) == 50
    stale = TurnState.model_validate_json(first.model_dump_json())
    stale.version = 0
    with pytest.raises(StateConflict):
        store.save(stale, ttl_seconds=60)
    # begin with state: the state comes back; a held lease is not taken
    again = store.begin(Lease(first.turn_id, "0:2:llm_call:1", "w1"), ttl_seconds=30)
    assert again.claimed and again.state is not None and again.state.version == 1
    assert not store.begin(Lease(first.turn_id, "0:2:llm_call:1", "w2"), ttl_seconds=30).claimed
    # release, each way
    store.release(Lease(first.turn_id, "0:2:llm_call:1", "w1"), why=Release.HELD_BACK)
    held_back = store.begin(Lease(first.turn_id, "0:2:llm_call:1", "w1"), ttl_seconds=30)
    assert (held_back.deliveries, held_back.held_back_at) == (1, 1)
    assert store.record_alone(Lease(first.turn_id, "0:2:llm_call:1", "w1"))  # the lease and its count share a slot
    store.release(Lease(first.turn_id, "0:2:llm_call:1", "w1"), why=Release.GIVEN_UP)
    store.release(Lease(first.turn_id, "0:2:llm_call:1", "w1"))

    # renew: leases of several turns (several slots) in one call; the ones lost are named
    leases = [Lease(state.turn_id, "0:0:reasoner:0", "w1") for state in states]
    for one in leases:
        assert store.claim(one, ttl_seconds=30)
    store.release(leases[2])
    assert store.claim(Lease(states[2].turn_id, "0:0:reasoner:0", "other"), ttl_seconds=30)
    assert store.renew(leases, ttl_seconds=60, alive_until=3e9) == [leases[2]]
    assert store.alive_until([state.turn_id for state in states])[states[1].turn_id] == 3e9

    # cancel flags and markers
    ids = [state.turn_id for state in states]
    store.cancel_many(ids[:3], ttl_seconds=60)
    assert [store.is_cancelled(turn_id) for turn_id in ids[:4]] == [True, True, True, False]
    assert set(store.alive_until(ids)) == set(ids[3:])
    assert store.begin(Lease(ids[0], "0:3:compose:1", "w1"), ttl_seconds=30).cancelled
    assert store.load(ids[2]) is None and store.load(ids[3]) is None
    store.save(states[3], ttl_seconds=60, leave_admission=True)
    store.mark_alive(ids, until=4e9)
    store.forget(ids[0])
    assert set(store.alive_until(ids)) == set(ids[1:])
    assert store.prune_markers(before=5e9) == 0  # markers expire by themselves
    store.forget_all()  # scans every node
    assert store.alive_until(ids) == {}

    # timers: parked across the shards (and nodes), each handed out once when due
    envelopes = [f'{{"turn_id": "{turn_id}", "n": {n}}}' for n, turn_id in enumerate(ids * 5)]
    for n, envelope in enumerate(envelopes):
        store.park(envelope, due=100.0 + n)
    assert store.pop_due(now=50.0) == []
    due = store.pop_due(now=1000.0, limit=1000)
    assert sorted(due) == sorted(envelopes)
    assert store.pop_due(now=1000.0) == []

    store.drop(first.turn_id)
    assert store.load(first.turn_id) is None


def test_the_admission_books_run_on_the_cluster_one_organisation_per_script(client: redis.Redis) -> None:
    queue = AdmissionQueue(client)
    orgs = [f"org-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for index, org in enumerate(orgs):
        queue.hold(org, [f"{org}-t{n}" for n in range(3 + index)], now=1000.0)
    assert queue.wait(0.1)
    counts = queue.counts()
    assert [(counts[org].held, counts[org].in_flight) for org in orgs] == [(3, 0), (4, 0), (5, 0)]

    release = queue.release(cap=2, limit=5, now=1000.0)
    assert release is not None and len(release.turn_ids) == 5 and set(release.orgs) <= set(orgs)
    assert queue.stale_releases(now=1000.0 + 10) != [] and queue.stale_releases(now=1000.0) == []
    more = queue.release(cap=2, limit=100, now=1001.0, settled=[release])  # its first round trip settles the first
    assert more is not None and len(release.turn_ids) + len(more.turn_ids) == 6  # the cap: 2 per organisation
    assert {r.release_id for r in queue.stale_releases(now=1000.0 + 10)} == {more.release_id}
    queue.settle(more)
    assert queue.stale_releases(now=1000.0 + 10) == []
    assert queue.release(cap=2, limit=100, now=1002.0) is None

    first = orgs[0]
    flying = [turn_id for turn_id, _ in queue.in_flight_since(first, before=2000.0)]
    assert len(flying) == 2
    assert queue.where(first, [*flying, f"{first}-t2"]) == {flying[0]: "in_flight", flying[1]: "in_flight",
                                                            f"{first}-t2": "held"}  # fmt: skip
    assert queue.finished(first, flying[:1]) == 1 and queue.wait(0.1)
    assert queue.leave(first, [flying[1], f"{first}-t2"]) == 1
    assert queue.withdraw(orgs[1], [f"{orgs[1]}-t3", f"{orgs[1]}-t0"]) >= 1
    queue.admit_now(orgs[2], ["interactive-1"], now=1003.0)
    assert queue.counts()[orgs[2]].in_flight == 3


def test_the_limiter_breaker_leader_and_event_log_run_on_the_cluster(client: redis.Redis) -> None:
    model = f"model-{uuid.uuid4().hex}"
    name, pause_name = limiter_keys("http://127.0.0.1:9/v1", model)
    limiter = RateLimiter(client, name=name, pause_name=pause_name, limits=Limits(rpm=60, tpm=6000))
    slot = limiter.acquire(100, now=1_700_000_000.0)
    assert slot.wait == 0
    limiter.settle(slot, used=50, now=1_700_000_000.5)
    assert limiter.pause(5.0, now=1_700_000_001.0) > 0
    assert limiter.acquire(10, now=1_700_000_001.0).wait > 0  # paused: the script read both keys
    breaker = CircuitBreaker(client, name=breaker_key("http://127.0.0.1:9/v1", model), failure_threshold=1)
    breaker.record_failure(100.0)
    assert breaker.before_call(100.1) > 0
    # the limits and the breaker in one script: their keys share a slot
    assert limiter.pace({"input": "x"}, breaker, at=100.2, now=1_700_000_010.0).breaker_wait > 0
    lease = LeaderLease(client, key=f"{RECONCILER_LEADER_KEY}-{uuid.uuid4().hex}", owner="a")
    assert lease.hold(10) and lease.hold(10)
    lease.give_up()
    log = RedisTurnEventLog(client, ttl_seconds=60, max_events=10)
    turn_id = f"turn_{uuid.uuid4().hex}"
    first = log.append(turn_id, "turn.started", {"a": 1})
    log.append(turn_id, "turn.completed", {})
    assert [event.event for event in log.read(turn_id, after=None, block_ms=0, count=10)] == [
        "turn.started", "turn.completed"
    ]  # fmt: skip
    assert [event.event_id for event in log.latest(turn_id, before=None, count=5)][-1] == first
    usage, today = TokenUsage(client), date(2026, 11, 26)
    pipelined(client, merge_calls(client)(TurnTokens("org-a", today, turn_id, 120)))
    assert usage.spent("org-a", today, seed=lambda: {"turn_old": 30}) == 150


def test_turns_complete_end_to_end_with_the_state_store_on_the_cluster(
    cluster: LocalRedisCluster, database_url: str, scripted_llm: ScriptedServer, modes_file: Path
) -> None:
    with redis_databases(1) as (broker_url,):
        stack, system = start_system(
            database_url=database_url, redis_urls=(cluster.url, broker_url), llm=scripted_llm,
            modes_file=modes_file, workers=["wc"],
        )  # fmt: skip
        try:
            _run_turns(system)
        finally:
            system.http.close()
            stack.stop_all()


def _run_turns(system: System) -> None:
    marker = uuid.uuid4().hex[:10]
    turn = system.run_turn({"input": f"hello {marker}"})
    assert turn["status"] == "completed" and turn["output_text"] == f"Echo: hello {marker}"
    key = f"cluster-{marker}"
    tool_turn = system.run_turn({"input": f"[[call:record_call {json.dumps({'key': key})}]] {key}"})
    assert tool_turn["status"] == "completed" and system.tool_calls(key) == 1
    batch = system.http.post(
        "/v1/batches",
        json={"requests": [{"input": f"batch {marker} {n}"} for n in range(4)]},
        headers=system.headers(),
    )
    assert batch.status_code == 202, batch.text
    batch_id = batch.json()["batch_id"]

    def batch_done() -> dict[str, Any] | None:
        body: dict[str, Any] = system.http.get(f"/v1/batches/{batch_id}", headers=system.headers()).json()
        return body if body["counts"]["queued"] + body["counts"]["running"] == 0 else None

    finished = wait_for(batch_done, what="the batch on the cluster to finish", seconds=120, interval=0.5)
    assert finished["counts"]["completed"] == 4, finished
