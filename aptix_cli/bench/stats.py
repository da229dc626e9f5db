"""Run figures: latency percentiles and throughput of a set of turns or chains."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["RunFigures", "percentile", "run_figures", "turn_latencies", "turn_latency"]


@dataclass(frozen=True, slots=True)
class RunFigures:
    """Throughput and latency of one run."""

    count: int
    """Items that finished (the latencies' count)."""
    elapsed: float
    """Seconds from submitting the first item to the last one finishing."""
    p50: float
    p95: float
    p99: float
    """Latency percentiles, seconds."""

    @property
    def rate(self) -> float:
        """Finished items per second over ``elapsed``."""
        return self.count / self.elapsed if self.elapsed > 0 else 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values``, interpolating linearly between ranks (numpy's default).

    Args:
        values: the sample, in any order.
        fraction: from 0 (minimum) to 1 (maximum).

    Returns:
        The quantile; NaN for an empty sample.

    Raises:
        ValueError: ``fraction`` is outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], not {fraction!r}")
    if not values:
        return math.nan
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def turn_latency(turn: Mapping[str, Any]) -> float | None:
    """Seconds from a turn's ``created_at`` to its ``completed_at`` (as the API returns a Turn); None
    while it has no ``completed_at``."""
    if not turn.get("completed_at"):
        return None
    return (
        datetime.fromisoformat(str(turn["completed_at"])) - datetime.fromisoformat(str(turn["created_at"]))
    ).total_seconds()


def turn_latencies(turns: Iterable[Mapping[str, Any]]) -> list[float]:
    """The :func:`turn_latency` of each turn that has one (as ``GET /v1/batches/{id}/results`` returns them)."""
    return [latency for turn in turns if (latency := turn_latency(turn)) is not None]


def run_figures(latencies: Sequence[float], *, started: float, finished: Sequence[float]) -> RunFigures:
    """Figures of a run whose items were submitted from ``started`` and finished at ``finished`` (epoch seconds).

    Args:
        latencies: each finished item's latency, seconds.
        started: when submitting began.
        finished: when each item finished.
    """
    elapsed = max(finished) - started if finished else 0.0
    return RunFigures(
        count=len(latencies),
        elapsed=elapsed,
        p50=percentile(latencies, 0.50),
        p95=percentile(latencies, 0.95),
        p99=percentile(latencies, 0.99),
    )
