"""Interactive turns: single plain turns, one at a time, and their latency (created to completed).

``aptix bench --interactive`` measures them on the idle system, then while a large batch runs; a
batch's messages go at a lower broker priority, so the second p95 should stay close to the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aptix_cli.batch_progress import IN_FLIGHT
from aptix_cli.bench.stats import turn_latency
from aptix_cli.client import MAX_WAIT_SECONDS, ApiClient

__all__ = ["InteractiveSample", "interactive_latencies"]


@dataclass(slots=True)
class InteractiveSample:
    """The interactive turns of one measurement."""

    started: int = 0
    latencies: list[float] = field(default_factory=list)
    """Seconds from created to completed, per turn that completed."""
    offsets: list[float] = field(default_factory=list)
    """Seconds from the measurement's start to each turn's start, every turn started (in order)."""
    completed_offsets: list[float] = field(default_factory=list)
    """The offsets of the turns that completed, in the order of :attr:`latencies`."""

    @property
    def all_completed(self) -> bool:
        """Whether every turn started completed."""
        return len(self.latencies) == self.started

    def first(self, seconds: float) -> InteractiveSample:
        """The turns of this measurement that started within its first ``seconds``."""
        completed = zip(self.completed_offsets, self.latencies, strict=True)
        kept = [(at, latency) for at, latency in completed if at < seconds]
        return InteractiveSample(
            started=sum(1 for at in self.offsets if at < seconds),
            latencies=[latency for _, latency in kept],
            offsets=[at for at in self.offsets if at < seconds],
            completed_offsets=[at for at, _ in kept],
        )


def interactive_latencies(
    api: ApiClient, *, seconds: float, per_second: float, stop: Callable[[], bool] = lambda: False
) -> InteractiveSample:
    """Start a plain turn every ``1 / per_second`` seconds (or when the last one finished, if later), for
    ``seconds`` or until ``stop``.

    Args:
        api: the gateway.
        seconds: how long to go on.
        per_second: turns started per second at most.
        stop: asked before each turn; True ends the measurement early.

    Returns:
        How many turns started, when each started, and the latency of each that completed.
    """
    sample = InteractiveSample()
    began = time.monotonic()
    deadline = began + seconds
    while time.monotonic() < deadline and not stop():
        now = time.monotonic()
        offset, next_start = now - began, now + 1.0 / per_second
        turn = api.create_turn({"input": f"interactive turn {sample.started}"}, wait=MAX_WAIT_SECONDS)
        sample.started += 1
        sample.offsets.append(offset)
        while turn["status"] in IN_FLIGHT:
            turn = api.get_turn(str(turn["turn_id"]), wait=MAX_WAIT_SECONDS)
        latency = turn_latency(turn)
        if turn["status"] == "completed" and latency is not None:
            sample.latencies.append(latency)
            sample.completed_offsets.append(offset)
        time.sleep(max(0.0, next_start - time.monotonic()))
    return sample
