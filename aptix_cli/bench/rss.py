"""RssSampler: the workers' summed resident memory, sampled while a run goes on, against turns finished.

Two figures (before and after) cannot tell a warm-up that levels off from a leak; a few points
along the run can. ``aptix bench --rss`` prints the sample nearest each quarter of the run.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

from aptix_cli.bench.cpu import descendants, read_processes, rss_bytes

__all__ = ["RssSample", "RssSampler"]

RssSample = tuple[int, int]
"""(turns finished, summed RSS in bytes)."""


class RssSampler:
    """A thread that samples every ``every_s`` seconds until the ``with`` block ends, and once more then."""

    def __init__(self, roots: Sequence[int], finished: Callable[[], int], *, every_s: float = 2.0) -> None:
        """Args:
        roots: the worker processes; their descendants are counted too.
        finished: how many turns of the run have finished so far.
        every_s: seconds between samples.
        """
        self._roots = list(roots)
        self._finished = finished
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self.samples: list[RssSample] = []

    def __enter__(self) -> Self:
        self._sample()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def along(self, total: int, points: int = 4) -> list[RssSample]:
        """The first sample at or past each ``1/points`` of ``total`` turns finished (0 included)."""
        ordered = sorted(self.samples)
        finished = [sample[0] for sample in ordered]
        chosen: list[RssSample] = []
        for step in range(points + 1):
            index = bisect.bisect_left(finished, total * step // points)
            if index < len(ordered) and ordered[index] not in chosen:
                chosen.append(ordered[index])
        return chosen

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._sample()

    def _sample(self) -> None:
        table = read_processes()
        self.samples.append((self._finished(), rss_bytes(table, descendants(table, self._roots))))
