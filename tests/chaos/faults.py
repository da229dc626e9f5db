"""The faults: one function each, injecting its fault into a running system while turns run.

A fault function submits its turns, injects the fault, brings the system back whole (replacement
processes ready) and returns a :class:`FaultRun`; it does not wait for the turns to end.
``FAULTS`` lists them with the system shape and the turn counts of the full and small matrices.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.task_names import DEFAULT_TASK_BOUNDARIES
from tests.chaos.backing import RedisServer, SentinelRedis
from tests.chaos.batch_load import BatchLoad
from tests.chaos.load import Ledger, post_turns, submit_batches, wait_fraction
from tests.chaos.poison import poison_step
from tests.chaos.report import FaultRun
from tests.chaos.responses_load import ResponseLoad
from tests.chaos.system import ChaosSystem, SystemOptions

__all__ = ["FAULTS", "Fault", "FaultPlan", "SystemFactory"]

logger = logging.getLogger(__name__)

_BATCH = 250
"""Turns per batch when a fault submits all its turns up front."""
_TRIGGER_TIMEOUT = 120.0
"""How long a fault waits for its trigger (a share of terminal turns) before it strikes anyway."""
_STREAMS_TIMEOUT = 90.0
_BATCHES_TIMEOUT = 180.0
"""How long after the faults the OpenAI batches may take to end (their files written)."""
"""How long after the kills the stream readers may take to reach their responses' terminal events."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """How one fault runs: its turn count and whether the small (shorter) timings apply."""

    name: str
    turns: int
    small: bool
    seed: int = 0
    task_boundaries: str = DEFAULT_TASK_BOUNDARIES.value
    """``APTIX_TASK_BOUNDARIES`` of the system's workers."""


FaultFunction = Callable[[ChaosSystem, FaultPlan, Ledger], FaultRun]
SystemFactory = Callable[..., ChaosSystem]
"""Builds a fault's system from ``fault_dir``, ``catalog`` and ``options`` (keywords)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault of the matrix."""

    run: FaultFunction
    options: SystemOptions
    turns: int
    small_turns: int
    system: SystemFactory = ChaosSystem
    """The system it runs on: processes on this host, or hosts apart (``tests.chaos.net.system.NetSystem``)."""


def worker_kill(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """SIGKILL a random worker every period for a window, starting a replacement each time."""
    period, window = _kill_timings(plan)
    run = FaultRun(f"SIGKILL a random worker every {period:.0f} s for {window:.0f} s, a replacement each time")
    keys = _keys("wk", plan.turns)
    rounds = int(window // period)
    # Turns arrive over most of the window, so the late kills still find turns in flight.
    submitter = _Background(lambda: submit_batches(
        system.gateway_url, keys, ledger=ledger, batches=2 * rounds, spread=window * 0.85
    ))  # fmt: skip
    _kill_workers(system, plan, run, period=period, window=window, load=submitter)
    return run


def openai_worker_kill(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """worker_kill's kills while the turns are background responses created with the ``openai`` SDK,
    some of whose streams are read in pieces, dropped and resumed until their terminal event."""
    period, window = _kill_timings(plan)
    streams = min(plan.turns, 12 if plan.small else 20)
    run = FaultRun(
        f"SIGKILL a random worker every {period:.0f} s for {window:.0f} s, a replacement each time; the turns are "
        f"background responses (openai SDK, Idempotency-Key each), {streams} of their streams read a few events "
        "at a time, dropped and resumed with starting_after"
    )
    keys = _keys("ow", plan.turns)
    spread = window * 0.85
    # The streams followed are those of the turns created just before a kill: the likeliest to be in flight on
    # the worker that dies, so that their streams wait, and are resumed, across its recovery.
    until_kill = {key: period - (index * spread / len(keys)) % period for index, key in enumerate(keys)}
    watched = set(sorted(keys, key=until_kill.__getitem__)[:streams])
    load = ResponseLoad(system.gateway_url, ledger=ledger, seed=f"{plan.name}-{plan.seed}")
    try:
        submitter = _Background(lambda: load.create(keys, spread=spread, watched=watched))
        _kill_workers(system, plan, run, period=period, window=window, load=submitter)
        checks = load.check_streams(timeout=_STREAMS_TIMEOUT)
    finally:
        load.close()
    run.stream_keys = [check.key for check in checks]
    run.broken_streams = [check.describe() for check in checks if check.problems]
    connections = sum(check.connections for check in checks)
    errors = sum(check.errors for check in checks)
    run.notes.append(f"{len(checks)} streams read over {connections} connections "
                     f"({connections - len(checks)} resumes; {errors} connections ended in an error)")  # fmt: skip
    return run


def openai_batch_faults(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """Batches created through ``/openai/v1`` (files, batches; openai SDK) over a window of worker kills with a
    Redis restart in its middle; then every request must be in exactly one of its batch's two files, once."""
    period, window = _kill_timings(plan)
    rounds = int(window // period)
    restart_at = rounds // 2 + 1
    run = FaultRun(
        f"OpenAI batches (files.create + batches.create, openai SDK) created over {window:.0f} s; SIGKILL a random "
        f"worker every {period:.0f} s (a replacement each time) but at {restart_at * period:.0f} s: SHUTDOWN NOSAVE "
        "of Redis (state + broker), started again 3 s later; then each batch's output and error files are read"
    )
    keys = _keys("ob", plan.turns)
    load = BatchLoad(system.gateway_url, ledger=ledger, tag=f"{plan.name}-{plan.seed}")
    try:
        creator = _Background(lambda: load.create(keys, batches=max(2, rounds // 2), spread=window * 0.7))
        _kill_workers(system, plan, run, period=period, window=window, load=creator, redis_restart_at=restart_at)
        problems, notes = load.check_files(timeout=_BATCHES_TIMEOUT)
    finally:
        load.close()
    run.batch_files = len(load.batches)
    run.broken_batch_files = problems
    run.notes += notes
    return run


def redis_restart(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """``SHUTDOWN NOSAVE`` the Redis server (state and broker) at ~30 % done; start it 3 s later."""
    run = FaultRun("SHUTDOWN NOSAVE of Redis (state + broker) at ~30 % terminal, started again 3 s later")
    _submit_all(system, plan, ledger, "rr")
    reached = wait_fraction(system.database.url, len(ledger.accepted), 0.3, timeout=_TRIGGER_TIMEOUT)
    started = time.monotonic()
    assert isinstance(system.redis, RedisServer), "this fault restarts a single Redis server"
    system.redis.shutdown_nosave()
    time.sleep(3.0)
    system.redis.start()
    run.fault_seconds = time.monotonic() - started
    run.notes.append(f"Redis shut down with {reached:.0%} of the turns terminal")
    return run


def sentinel_failover(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """SIGKILL the Sentinel-managed primary (state and broker) at ~30 % done; once the sentinels promoted the
    replica, start the old primary again, empty, as the new primary's replica (the setup whole again)."""
    run = FaultRun(
        "SIGKILL of the Redis primary (state + broker; 1 replica, 3 sentinels, down-after 2 s) at ~30 % terminal; "
        "the old primary back as a replica once the sentinels promoted its replica"
    )
    sentinels = system.redis
    assert isinstance(sentinels, SentinelRedis), "sentinel_failover runs on SystemOptions(sentinel=True)"
    _submit_all(system, plan, ledger, "sf")
    reached = wait_fraction(system.database.url, len(ledger.accepted), 0.3, timeout=_TRIGGER_TIMEOUT)
    started = time.monotonic()
    run.struck_at = time.time()
    old = sentinels.kill_primary()
    new = sentinels.wait_promoted(old)
    promoted = time.monotonic() - started
    sentinels.restart_as_replica(old, primary=new)
    run.fault_seconds = time.monotonic() - started
    run.notes.append(
        f"primary killed with {reached:.0%} of the turns terminal; the replica promoted {promoted:.1f} s later"
    )
    return run


def model_outage(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """Kill the scripted model at ~20 % done; restart it on the same port 10 s later."""
    outage = 10.0
    run = FaultRun(f"SIGKILL the model at ~20 % terminal, restarted on the same port after {outage:.0f} s")
    _submit_all(system, plan, ledger, "mo")
    reached = wait_fraction(system.database.url, len(ledger.accepted), 0.2, timeout=_TRIGGER_TIMEOUT)
    started = time.monotonic()
    system.kill_model()
    time.sleep(outage)
    system.start_model()
    run.fault_seconds = time.monotonic() - started
    run.notes.append(f"model killed with {reached:.0%} of the turns terminal")
    return run


def pg_terminate(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """Terminate every backend of the database 40 times, every 0.25 s, while turns run and probes post."""
    rounds, pause, probes = 40, 0.25, 10 if plan.small else 20
    run = FaultRun(
        f"pg_terminate_backend on every connection {rounds} times, every {pause} s; "
        f"{probes} single POST /v1/turns meanwhile"
    )
    _submit_all(system, plan, ledger, "pg")
    probe_keys = _keys("pg-probe", probes)

    def post_probes() -> None:
        for key in probe_keys:
            post_turns(system.gateway_url, [key], ledger=ledger, clients=1, give_up=60.0)
            time.sleep(rounds * pause / probes)

    prober = _Background(post_probes)
    started = time.monotonic()
    terminated = 0
    for _ in range(rounds):
        terminated += system.database.terminate_backends()
        time.sleep(pause)
    run.fault_seconds = time.monotonic() - started
    prober.join()
    run.notes.append(f"{terminated} backends terminated")
    return run


def gateway_kill(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """One concurrent client per turn (idempotency keys, retries); SIGKILL the gateway mid-way, restart it."""
    kill_after = 30 if plan.small else 50
    run = FaultRun(
        f"{plan.turns} concurrent clients POST one turn each (idempotency_key, retried on errors/5xx); "
        f"SIGKILL the gateway after ~{kill_after} answers, restarted on the same port 1 s later"
    )
    keys = _keys("gk", plan.turns)
    poster = _Background(lambda: post_turns(
        system.gateway_url, keys, ledger=ledger, clients=len(keys), give_up=120.0
    ))  # fmt: skip
    answered = ledger.wait_answered(kill_after, timeout=60.0)
    started = time.monotonic()
    system.kill_gateway()
    time.sleep(1.0)
    system.start_gateway()
    run.fault_seconds = time.monotonic() - started
    poster.join()
    run.notes.append(f"gateway killed after {answered} answers")
    return run


def reconciler_kill(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """Standalone reconcilers: kill a worker, then a reconciler, then a worker again, a replacement each time."""
    run = FaultRun("workers with --no-reconciler + 2 reconcilers; SIGKILL a worker at 15 %, "
                   "a reconciler at 30 %, a worker at 45 % terminal (replacement each time)")  # fmt: skip
    _submit_all(system, plan, ledger, "rk")
    rng = random.Random(f"{plan.name}-{plan.seed}")
    started: float | None = None
    for share, target in ((0.15, "worker"), (0.30, "reconciler"), (0.45, "worker")):
        reached = wait_fraction(system.database.url, len(ledger.accepted), share, timeout=_TRIGGER_TIMEOUT)
        started = started or time.monotonic()
        if target == "worker":
            system.kill_worker(rng)
            run.workers_killed += 1
            system.spawn_worker()
        else:
            victim = system.kill_reconciler()
            system.start_reconciler()
            run.notes.append(f"killed {victim.name} with {reached:.0%} terminal")
    for worker in list(system.workers):
        system.wait_worker(worker)
    run.fault_seconds = time.monotonic() - (started or time.monotonic())
    return run


def redis_cluster_failover(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """The state store on a Redis Cluster (three primaries, a replica each): SIGKILL a primary at ~30 % done;
    its replica takes over. The report measures the stall from the kill (``FaultRun.struck_at``)."""
    cluster = system.cluster
    if cluster is None:
        raise RuntimeError("redis_cluster_failover needs SystemOptions(state_cluster=True)")
    run = FaultRun("state store on a Redis Cluster (3 primaries, 1 replica each; broker on a plain Redis): "
                   "SIGKILL one primary at ~30 % terminal, its replica promoted")  # fmt: skip
    _submit_all(system, plan, ledger, "cf")
    reached = wait_fraction(system.database.url, len(ledger.accepted), 0.3, timeout=_TRIGGER_TIMEOUT)
    victim = random.Random(f"{plan.name}-{plan.seed}").choice(sorted(cluster.primary_ports()))
    replica = cluster.replica_of(victim)
    started = time.monotonic()
    run.struck_at = time.time()
    cluster.kill(victim)
    logger.info("killed the cluster primary on port %d (its replica is on %d)", victim, replica)
    promoted = cluster.wait_promoted(replica, timeout=60.0)
    run.fault_seconds = time.monotonic() - started
    run.notes.append(f"primary :{victim} killed with {reached:.0%} of the turns terminal; its replica :{replica} "
                     f"served every slot {promoted:.1f} s after the kill")  # fmt: skip
    return run


FAULTS: dict[str, Fault] = {
    "worker_kill": Fault(worker_kill, SystemOptions(), turns=1000, small_turns=100),
    "openai_worker_kill": Fault(openai_worker_kill, SystemOptions(), turns=300, small_turns=60),
    "openai_batch_faults": Fault(openai_batch_faults, SystemOptions(), turns=400, small_turns=60),
    "redis_restart": Fault(redis_restart, SystemOptions(), turns=500, small_turns=80),
    "sentinel_failover": Fault(sentinel_failover, SystemOptions(sentinel=True), turns=1000, small_turns=100),
    "model_outage": Fault(model_outage, SystemOptions(), turns=200, small_turns=60),
    "pg_terminate": Fault(pg_terminate, SystemOptions(), turns=500, small_turns=80),
    "gateway_kill": Fault(gateway_kill, SystemOptions(), turns=200, small_turns=100),
    "reconciler_kill": Fault(reconciler_kill, SystemOptions(reconcilers=2), turns=300, small_turns=80),
    "poison_step": Fault(poison_step, SystemOptions(), turns=300, small_turns=60),
    "redis_cluster_failover": Fault(
        redis_cluster_failover, SystemOptions(state_cluster=True), turns=1000, small_turns=100
    ),
}
"""Every fault, in the order the matrix runs them."""


def _kill_timings(plan: FaultPlan) -> tuple[float, float]:
    """The kill period and window (seconds) of the worker-kill faults."""
    return (3.0, 15.0) if plan.small else (5.0, 65.0)


def _kill_workers(
    system: ChaosSystem,
    plan: FaultPlan,
    run: FaultRun,
    *,
    period: float,
    window: float,
    load: _Background,
    redis_restart_at: int | None = None,
) -> None:
    """Kill a random ready worker every ``period`` for ``window`` seconds (a replacement each time), wait for
    ``load`` and for every worker to be ready again; counts the kills and the fault's length in ``run``.
    Round ``redis_restart_at`` (1 is the first), if given, restarts Redis (``SHUTDOWN NOSAVE``, started
    again 3 s later) instead of killing a worker."""
    rng = random.Random(f"{plan.name}-{plan.seed}")
    started = time.monotonic()
    for index in range(1, int(window // period) + 1):
        time.sleep(max(0.0, started + index * period - time.monotonic()))
        if index == redis_restart_at:
            system.redis.shutdown_nosave()
            time.sleep(3.0)
            system.redis.start()
            run.notes.append(f"Redis restarted at {time.monotonic() - started:.0f} s")
            continue
        try:
            system.kill_worker(rng)
        except LookupError:
            run.notes.append(f"no ready worker to kill at {index * period:.0f} s")
            continue
        run.workers_killed += 1
        system.spawn_worker()
    load.join()
    for worker in list(system.workers):
        system.wait_worker(worker)
    run.fault_seconds = time.monotonic() - started


def _keys(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{index:05d}" for index in range(count)]


def _submit_all(system: ChaosSystem, plan: FaultPlan, ledger: Ledger, prefix: str) -> None:
    keys = _keys(prefix, plan.turns)
    submit_batches(system.gateway_url, keys, ledger=ledger, batches=-(-len(keys) // _BATCH))


class _Background:
    """A thread running ``target``; :meth:`join` re-raises what it raised."""

    def __init__(self, target: Callable[[], None]) -> None:
        self._target = target
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            self._target()
        except Exception as exc:
            self._error = exc
