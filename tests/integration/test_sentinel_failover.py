"""A Sentinel-managed Redis (a primary, one replica, three sentinels: real ``redis-server`` processes on
loopback, ``tests.chaos.backing.SentinelRedis``) under the broker and the state store at once.

A primary SIGKILLed while turns run, and a live primary demoted by ``SENTINEL FAILOVER`` (its open
connections then answer ``READONLY``): every turn completes, none is lost, no server tool runs twice,
and the gateway and worker processes follow the new primary without a restart. In process: a step
whose state store answers ``READONLY`` (a demoted primary named by a plain ``redis://`` URL) is run
again later, never failed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.redis_clients import redis_client
from shared.state import RedisStateStore
from shared.task_names import StepName
from tests.chaos.backing import SentinelRedis
from tests.chaos.evidence import collect
from tests.chaos.faults import _keys
from tests.chaos.load import Ledger, post_turns, submit_batches, wait_fraction, wait_settled
from tests.chaos.report import FaultRun, build_report
from tests.chaos.runner import write_catalog
from tests.chaos.system import ChaosSystem, SystemOptions
from tests.unit.fakes import make_context, record_turn, with_store
from workers.driver import run_step

pytestmark = pytest.mark.integration

TURNS = 40


@pytest.fixture
def sentinels(services: None, tmp_path: Path) -> Iterator[SentinelRedis]:
    """A primary, a replica and three sentinels of this test's own; every process ended at the end."""
    setup = SentinelRedis(log_dir=tmp_path)
    try:
        setup.start()
        yield setup
    finally:
        setup.stop()


@pytest.mark.timeout(600)
def test_turns_complete_through_a_kill_and_a_demotion_of_the_primary_with_nothing_lost_or_run_twice(
    services: None, tmp_path: Path
) -> None:
    # Given a gateway and a worker whose broker and state store are one Sentinel-managed primary
    system = ChaosSystem(
        fault_dir=tmp_path,
        catalog=write_catalog(tmp_path / "modes.yaml"),
        options=SystemOptions(workers=1, sentinel=True),
    )
    ledger = Ledger()
    try:
        system.start()
        sentinels = system.redis
        assert isinstance(sentinels, SentinelRedis)
        worker, gateway = system.workers[0], system.gateway
        assert gateway is not None

        # When the primary is SIGKILLed while a batch runs, comes back as a replica, and the new primary is
        # then demoted while alive (every process's open connections to it answer READONLY)
        submit_batches(system.gateway_url, _keys("sf", TURNS), ledger=ledger, batches=1)
        wait_fraction(system.database.url, TURNS, 0.2, timeout=120)
        killed = sentinels.kill_primary()
        promoted = sentinels.wait_promoted(killed)
        sentinels.restart_as_replica(killed, primary=promoted)
        demoted, _ = sentinels.failover()
        post_turns(system.gateway_url, _keys("after", 5), ledger=ledger, clients=5, give_up=60)
        settled = wait_settled(system.database.url, deadline=time.monotonic() + 180)
        report = build_report("sentinel", FaultRun("kill, then demotion"), ledger, collect(system))

        # Then every turn completed with its answer, once, through both failovers, on the same processes
        assert demoted == promoted
        assert settled, report.unfinished
        assert report.accepted == TURNS + 5 and report.not_accepted == 0
        assert (report.completed, report.lost, sum(report.failed.values())) == (TURNS + 5, 0, 0), report.examples
        assert report.tool_runs["2+"] == 0 and report.wrong_output == 0
        assert report.gateway_5xx_not_503() == 0
        assert worker.alive() and system.workers == [worker] and system.gateway is gateway and gateway.alive()
    finally:
        system.close()


def test_a_readonly_reply_from_a_demoted_primary_is_retried_later_and_the_turn_goes_on(
    sentinels: SentinelRedis,
) -> None:
    # Given a turn recorded, a Sentinel client in use before a failover, and the primary demoted by one
    ctx = make_context()
    env = record_turn(ctx)
    following = redis_client(sentinels.url(0), socket_timeout=5)
    following.set("aptix:test:before", "1")
    demoted, _promoted = sentinels.failover()

    # When the turn's step runs on a state store that reaches the demoted node by a plain redis:// URL
    stale = RedisStateStore(redis_client(sentinels.node_url(demoted), socket_timeout=5))
    dispatch = run_step(with_store(ctx, stale), env)  # type: ignore[arg-type]  # a Redis store, as in production

    # Then READONLY is an outage: the same step is sent again later, and the turn is not failed
    assert dispatch is not None and dispatch.failed is None
    assert (dispatch.envelope.step, dispatch.envelope.attempt) == (env.step, env.attempt + 1)
    assert dispatch.countdown > 0
    recorded = ctx.turns.get(env.turn_id)
    assert recorded is not None and recorded.status == "queued"

    # And the Sentinel client, unchanged, now writes to the promoted primary, where the step goes on
    assert following.incr("aptix:test:before") == 2
    store = RedisStateStore(following)
    moved = run_step(with_store(ctx, store), dispatch.envelope)  # type: ignore[arg-type]
    assert moved is not None and moved.envelope.step is StepName.REASONER
