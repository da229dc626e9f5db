"""The network faults: hosts apart (``tests.chaos.net.system``), each fault during a mixed load.

The load of every fault (:class:`MixedLoad`): three quarters server-tool turns, created as
background responses with the ``openai`` SDK (some of their streams read in pieces, dropped and
resumed with ``starting_after`` until their terminal event), one quarter client-tool turns over
``/v1/turns`` whose tool calls the harness answers. Turns arrive over a window around the fault, so
that the fault finds turns in flight on the host it strikes. The victim is always ``worker1``.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import datetime, timedelta

from tests.chaos.faults import Fault, FaultPlan, _Background, _keys
from tests.chaos.load import Ledger, client_tool_turns, post_turns
from tests.chaos.net.system import BROKER_PORT, NetShape, NetSystem
from tests.chaos.processes import kill_tree
from tests.chaos.report import FaultRun
from tests.chaos.responses_load import ResponseLoad
from tests.chaos.system import ChaosSystem, SystemOptions

__all__ = ["NET_FAULTS", "PARTITION_SECONDS"]

logger = logging.getLogger(__name__)

PARTITION_SECONDS = 30.0
"""How long a worker host is cut off (above the lease, the visibility timeout and the reconciler deadline)."""
GATEWAY_CUT_SECONDS = 10.0
_PROMPT_ANSWER_SECONDS = 5.0
"""The longest a POST may take while the gateway is cut off from the broker: a 503 comes at once."""
_RETURN_SECONDS = 30.0
"""How long after a heal a fault waits for the victim to come back and finish what it held."""
_LEAD = 6.0
"""Seconds of load before a fault strikes: the victim then holds steps."""
_STREAMS_TIMEOUT = 120.0
_CLIENT_GIVE_UP = 240.0
"""How long a client-tool turn's client keeps at it (POST, waits, results) before it gives up."""


class MixedLoad:
    """Server-tool turns as background responses (some streams followed) and client-tool turns: half of each
    over the first ``lead`` seconds (so that the fault, striking then, finds many in flight), the rest over the
    remaining ``spread - lead`` seconds."""

    def __init__(
        self, system: ChaosSystem, plan: FaultPlan, ledger: Ledger, run: FaultRun, *, spread: float, lead: float
    ) -> None:
        keys = _keys(plan.name[:2], plan.turns)
        client_count = max(1, plan.turns // 4)
        self.server_keys = keys[client_count:]
        self.client_keys = keys[:client_count]
        run.client_tool_keys = set(self.client_keys)
        self._run = run
        # Follow the streams of the turns created last before the fault strikes: the likeliest to cross it.
        half = len(self.server_keys) // 2
        watched = set(self.server_keys[max(0, half - max(1, len(self.server_keys) // 6)) : half])
        self._load = ResponseLoad(system.gateway_url, ledger=ledger, seed=f"{plan.name}-{plan.seed}")

        def create() -> None:
            self._load.create(self.server_keys[:half], spread=lead, watched=watched)
            self._load.create(self.server_keys[half:], spread=spread - lead, watched=())

        def answer() -> None:
            client_half = len(self.client_keys) // 2
            for keys, window in (
                (self.client_keys[:client_half], lead),
                (self.client_keys[client_half:], spread - lead),
            ):
                client_tool_turns(system.gateway_url, keys, ledger=ledger, clients=8, spread=window,
                                  give_up=_CLIENT_GIVE_UP)  # fmt: skip

        self._server = _Background(create)
        self._client = _Background(answer)

    def join(self) -> None:
        """Wait for every turn to be created and every client-tool turn answered; check the followed streams."""
        try:
            self._server.join()
            checks = self._load.check_streams(timeout=_STREAMS_TIMEOUT)
            self._client.join()
        finally:
            self._load.close()
        self._run.stream_keys = [check.key for check in checks]
        self._run.broken_streams = [check.describe() for check in checks if check.problems]
        connections = sum(check.connections for check in checks)
        self._run.notes.append(
            f"{len(self.server_keys)} server-tool turns (responses), {len(self.client_keys)} client-tool turns; "
            f"{len(checks)} streams read over {connections} connections ({connections - len(checks)} resumes)"
        )


def worker_partition(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """worker1 cut off from everything (Redis, PostgreSQL, the model) both ways for 30 s, then healed."""
    return _partition(system, plan, ledger, inbound_only=False)


def one_way_partition(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """worker1 can send but not receive for 30 s, then healed."""
    return _partition(system, plan, ledger, inbound_only=True)


def slow_lossy_link(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """worker1's link slow (the shape's added round trip) and lossy for the whole run."""
    net = _net(system)
    run = FaultRun(
        f"{net.shape.slow_link_ms:.0f} ms added to every round trip of worker1 (relay) and "
        f"{net.shape.loss:.0%} of its packets dropped each way (iptables statistic), the whole run"
    )
    started = time.monotonic()
    MixedLoad(system, plan, ledger, run, spread=20.0, lead=_LEAD).join()
    run.fault_seconds = time.monotonic() - started
    return run


def clock_ahead(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """worker1's clock ahead for the whole run; the other worker SIGKILLed once mid-way (a replacement started),
    so that leases, markers and deadlines are also tested on the recovery path."""
    net = _net(system)
    run = FaultRun(
        f"worker1's clock {net.shape.clock_ahead_seconds:g} s ahead (libfaketime) the whole run; worker2 "
        "SIGKILLed once after 8 s, a replacement on its host"
    )
    started = time.monotonic()
    load = MixedLoad(system, plan, ledger, run, spread=20.0, lead=_LEAD)
    time.sleep(8.0)
    victim = next(worker for worker in system.workers if net.host_of(worker) != net.worker_hosts[0])
    system.workers.remove(victim)
    kill_tree(victim)
    run.workers_killed += 1
    system.wait_worker(net.spawn_worker(net.host_of(victim)))
    load.join()
    run.fault_seconds = time.monotonic() - started
    return run


def gateway_broker_cut(system: ChaosSystem, plan: FaultPlan, ledger: Ledger) -> FaultRun:
    """The gateway's host cut off from the broker (its port only) for 10 s while clients keep posting."""
    net = _net(system)
    gateway = net.gateway_host
    if gateway is None or net.network is None:
        raise RuntimeError("the system has no gateway host")
    run = FaultRun(
        f"the gateway host cut off from the broker for {GATEWAY_CUT_SECONDS:.0f} s (both ways, its port only); "
        "server-tool turns POSTed one at a time with idempotency keys (retried on 503 and errors) and "
        "client-tool turns, all the while"
    )
    run.max_answer_seconds = _PROMPT_ANSWER_SECONDS
    keys = _keys("gb", plan.turns)
    client_count = max(1, plan.turns // 4)
    client_keys, server_keys = keys[:client_count], keys[client_count:]
    run.client_tool_keys = set(client_keys)
    spread = _LEAD + GATEWAY_CUT_SECONDS + 8.0

    def post_spread() -> None:
        began = time.monotonic()
        for index, key in enumerate(server_keys):
            time.sleep(max(0.0, began + spread * index / len(server_keys) - time.monotonic()))
            post_turns(system.gateway_url, [key], ledger=ledger, clients=1, give_up=120.0)

    poster = _Background(post_spread)
    clients = _Background(lambda: client_tool_turns(
        system.gateway_url, client_keys, ledger=ledger, clients=8, spread=spread, give_up=_CLIENT_GIVE_UP
    ))  # fmt: skip
    time.sleep(_LEAD)
    started = time.monotonic()
    net.network.cut_port(gateway, BROKER_PORT)
    time.sleep(GATEWAY_CUT_SECONDS)
    net.network.heal(gateway)
    run.fault_seconds = time.monotonic() - started
    poster.join()
    clients.join()
    run.notes.append(
        f"{len(server_keys)} server-tool turns, {len(client_keys)} client-tool turns; {ledger.errors.get('503', 0)} "
        f"answers 503; the slowest answer took {ledger.slowest_answer_seconds:.2f} s, the slowest error "
        f"{ledger.slowest_error_seconds:.2f} s"
    )
    return run


def _partition(system: ChaosSystem, plan: FaultPlan, ledger: Ledger, *, inbound_only: bool) -> FaultRun:
    net = _net(system)
    victim = net.worker_hosts[0]
    if net.network is None:
        raise RuntimeError("the system has no network")
    how = "can send but not receive" if inbound_only else "cut off both ways"
    run = FaultRun(f"worker1 {how} (Redis, PostgreSQL, the model) for {PARTITION_SECONDS:.0f} s after {_LEAD:.0f} s "
                   "of load, then healed; the worker process lives on throughout")  # fmt: skip
    load = MixedLoad(system, plan, ledger, run, spread=_LEAD + PARTITION_SECONDS + 6.0, lead=_LEAD)
    time.sleep(_LEAD)
    started = time.monotonic()
    (net.network.cut_inbound if inbound_only else net.network.cut)(victim)
    time.sleep(PARTITION_SECONDS)
    net.network.heal(victim)
    healed = time.monotonic()
    run.fault_seconds = healed - started
    load.join()
    # TCP backs off while its packets are dropped: the victim's connections may resume only ~20 s after the
    # heal, and then it finishes the steps it still holds. Give it that long before the evidence is read.
    time.sleep(max(0.0, healed + _RETURN_SECONDS - time.monotonic()))
    worker = next(each for each in system.workers if net.host_of(each) == victim)
    after_heal = _log_since(worker.log(), healed - started)
    run.notes.append(
        f"worker1 after the heal: {after_heal.count('lost the lease')} lost-lease warnings, "
        f"{after_heal.count(': StateConflict;')} save(s) refused as stale, "
        f"{after_heal.count('already ran')} redelivered step(s) passed on"
    )
    return run


def _log_since(log: str, seconds_ago: float) -> str:
    """The lines of a process log stamped within the last ``seconds_ago`` seconds (its lines start with a time)."""
    cutoff = (datetime.now() - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%d %H:%M:%S")
    return "\n".join(line for line in log.splitlines() if line[:19] >= cutoff)


def _net(system: ChaosSystem) -> NetSystem:
    if not isinstance(system, NetSystem):
        raise TypeError("a network fault runs on a NetSystem")
    return system


def _hosts(shape: NetShape) -> functools.partial[NetSystem]:
    return functools.partial(NetSystem, shape=shape)


_OPTIONS = SystemOptions(model_latency_ms=1000.0)
"""A model answering in a second, as real ones do: a worker holds its model calls long enough for a fault to
find several in its hands (at 100 ms, a host cut off mostly held none)."""
NET_FAULTS: dict[str, Fault] = {
    "worker_partition": Fault(worker_partition, _OPTIONS, 60, 40, system=_hosts(NetShape())),
    "one_way_partition": Fault(one_way_partition, _OPTIONS, 60, 40, system=_hosts(NetShape())),
    "slow_lossy_link": Fault(slow_lossy_link, _OPTIONS, 60, 40, system=_hosts(NetShape(slow_link_ms=200.0, loss=0.01))),
    "gateway_broker_cut": Fault(gateway_broker_cut, _OPTIONS, 60, 40, system=_hosts(NetShape())),
    "clock_ahead": Fault(clock_ahead, _OPTIONS, 60, 40, system=_hosts(NetShape(clock_ahead_seconds=3.0))),
}
"""Every network fault, in the order ``make chaos-net`` runs them."""
