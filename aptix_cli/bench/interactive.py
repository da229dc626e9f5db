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

    @property
    def all_completed(self) -> bool:
        """Whether every turn started completed."""
        return len(self.latencies) == self.started


def interactive_latencies(
    api: ApiClient, *, seconds: float, per_second: float, stop: Callable[[], bool] = lambda: False
) -> InteractiveSample:
    """Start a plain turn every ``1 / per_second`` seconds (or when the last one finished, if later).

    Args:
        api: the gateway.
        seconds: how long to go on.
        per_second: turns started per second at most.
        stop: asked before each turn; True ends the measurement early.

    Returns:
        How many turns started, and the latency of each that completed.
    """
    sample = InteractiveSample()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop():
        next_start = time.monotonic() + 1.0 / per_second
        turn = api.create_turn({"input": f"interactive turn {sample.started}"}, wait=MAX_WAIT_SECONDS)
        sample.started += 1
        while turn["status"] in IN_FLIGHT:
            turn = api.get_turn(str(turn["turn_id"]), wait=MAX_WAIT_SECONDS)
        latency = turn_latency(turn)
        if turn["status"] == "completed" and latency is not None:
            sample.latencies.append(latency)
        time.sleep(max(0.0, next_start - time.monotonic()))
    return sample
