"""One measured run: a batch of Aptix turns or of bare chains, with the CPU of every process group around it.

CPU is sampled just before the batch is submitted and just after its last item finished, so
reading the results afterwards is not counted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import redis
from celery import Celery

from aptix_cli.bench import bare_chain, turn_runs
from aptix_cli.bench.cpu import CpuMeter, CpuSample
from aptix_cli.bench.hops import TurnHops, read_hops
from aptix_cli.bench.scenarios import Scenario
from aptix_cli.bench.server_stats import ServerFigures, ServerStats
from aptix_cli.bench.stats import RunFigures, run_figures
from aptix_cli.client import ApiClient
from shared.task_names import TaskBoundaries

__all__ = ["ChainResult", "HopSample", "TurnResult", "measure_chains", "measure_turns"]

_HOP_SAMPLE = 20
_STALL_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class HopSample:
    """The hops of a sample of a run's turns."""

    sampled: int
    mean: float
    common: TurnHops | None
    """The most frequent hop sequence (None when no turn's state was found)."""


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A measured batch of turns."""

    run: turn_runs.TurnRun
    cpu_ms: dict[str, float | None]
    """CPU per turn by process group, ms (None: the group's processes are not on this machine)."""
    hops: HopSample
    servers: ServerFigures | None = None
    """What the Redis servers and PostgreSQL did per turn, by their own counters (None: not counted)."""


@dataclass(frozen=True, slots=True)
class ChainResult:
    """A measured set of bare chains."""

    hops: TurnHops
    figures: RunFigures
    chains: int
    cpu_ms: dict[str, float | None]
    """CPU per chain by process group, ms."""

    @property
    def all_finished(self) -> bool:
        """Whether every chain sent reached its last hop."""
        return self.figures.count == self.chains


def measure_turns(
    api: ApiClient,
    scenario: Scenario,
    turns: int,
    *,
    meter: CpuMeter,
    state: redis.Redis,
    poster: Callable[[], turn_runs.ToolResultPoster] | None,
    progress: TextIO | None,
    first_index: int = 0,
    servers: ServerStats | None = None,
    boundaries: TaskBoundaries = TaskBoundaries.LAYER,
) -> TurnResult:
    """Run ``turns`` turns of ``scenario`` as one batch and measure it.

    Args:
        api: the gateway.
        scenario: what each turn does.
        turns: the batch's size.
        meter: the process groups to count.
        state: the state store's Redis database (for the turns' hops).
        poster: makes the client tool result poster, for a scenario that needs one.
        progress: where the progress bar goes.
        first_index: the first turn's number in its text (so no two runs send the same text).
        servers: the Redis servers and PostgreSQL to count (their own counters), sampled with the CPU.
        boundaries: where the workers end a step task (to count the turns' hops).
    """
    answering = poster() if poster is not None and scenario.client_tool else None
    try:
        counted = servers.sample() if servers is not None else None
        before = meter.sample()
        submitted = turn_runs.submit(api, scenario, turns, first_index=first_index)
        turn_runs.wait(api, submitted, poster=answering, progress=progress)
        after = meter.sample()
        figures = servers.figures(counted, servers.sample(), turns) if servers is not None and counted else None
    finally:
        if answering is not None:
            answering.close()
    run = turn_runs.collect(api, scenario, submitted)
    return TurnResult(
        run=run,
        cpu_ms=_per_item_ms(meter, before, after, turns),
        hops=_sample_hops(state, run.turn_ids, boundaries),
        servers=figures,
    )


def measure_chains(
    app: Celery,
    done: redis.Redis,
    hops: TurnHops,
    chains: int,
    *,
    meter: CpuMeter,
    prefix: str,
) -> ChainResult:
    """Send ``chains`` bare chains over ``hops``' queues at once and measure them until the last finishes."""
    done.delete(bare_chain.DONE_KEY)
    ids = [f"{prefix}-{index}" for index in range(chains)]
    before = meter.sample()
    sent = bare_chain.send_chains(app, hops.queues, ids)
    finished = _wait_chains(done, chains)
    after = meter.sample()
    latencies = [finished[chain_id] - sent[chain_id] for chain_id in finished if chain_id in sent]
    started = min(sent.values()) if sent else time.time()
    return ChainResult(
        hops=hops,
        figures=run_figures(latencies, started=started, finished=list(finished.values())),
        chains=chains,
        cpu_ms=_per_item_ms(meter, before, after, chains),
    )


def _wait_chains(done: redis.Redis, chains: int) -> dict[str, float]:
    last, last_change = -1, time.monotonic()
    while True:
        count = int(done.zcard(bare_chain.DONE_KEY))
        if count >= chains:
            break
        if count != last:
            last, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > _STALL_SECONDS:
            break
        time.sleep(0.1)
    return bare_chain.finished_chains(done)


def _per_item_ms(meter: CpuMeter, before: CpuSample, after: CpuSample, items: int) -> dict[str, float | None]:
    used = meter.used(before, after)
    return {name: (used[name] * 1000 / items if after.get(name) else None) for name in used}


def _sample_hops(state: redis.Redis, turn_ids: Sequence[str], boundaries: TaskBoundaries) -> HopSample:
    """The hops of up to ``_HOP_SAMPLE`` turns spread over the batch."""
    step = max(1, len(turn_ids) // _HOP_SAMPLE)
    found = read_hops(state, turn_ids[::step][:_HOP_SAMPLE], boundaries)
    if not found:
        return HopSample(sampled=0, mean=0.0, common=None)
    counts = Counter(found.values())
    mean = sum(len(hops.tasks) for hops in found.values()) / len(found)
    return HopSample(sampled=len(found), mean=mean, common=counts.most_common(1)[0][0])
