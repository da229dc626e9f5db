"""DispatchDelays: how long this worker process's step messages waited before their task started.

Every step message carries the time it was sent (``shared.step_sender.SENT_AT_HEADER``: the time it
was due, for a message sent with a countdown). A step task's start notes how long ago that was: the
broker's queue, the worker's prefetched messages, a thread pool's queue or a gevent hub busy with other
greenlets, all of it. Every :data:`~workers.admission_window.CONTROL_SECONDS` the process reports the
shortest wait it noted since its last report (one ``HSET``, from the task that finds a report due),
and the admission scheduler sizes its window from the reports (``workers.admission_window``).

The shortest, as CoDel reads a queue: turns released together, or a model's answers arriving
together, make a burst whose last messages wait behind its first however few turns are in flight;
only when even the shortest wait of half a second is long is there a queue that stays. Measured on
the 2-core machine (docs/benchmarks.md, "2026-11-27, admission window"): sized from the 90th
percentile (15 ms) or the median (5 ms), the window read those bursts as a queue behind a 200 ms
model and held the batch at about 14 turns a second; from the shortest (5 ms), the batch ran at
63 turns/s there and 94 behind an instant model.

The clocks of the hosts must agree to a millisecond or so (docs/scaling.md asks for NTP); a wait
below zero counts as zero, and one above :data:`LONGEST_COUNTED_SECONDS` (a message redelivered
after its worker died) counts as that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from shared.state.admission import DelayReport
from workers.admission_window import CONTROL_SECONDS

__all__ = ["LONGEST_COUNTED_SECONDS", "DispatchDelays"]

logger = logging.getLogger(__name__)

LONGEST_COUNTED_SECONDS = 10.0
"""A longer wait is a redelivery or a countdown's lateness, not a queue: it counts as this long."""


class DispatchDelays:
    """One process's dispatch delays, reported every :data:`CONTROL_SECONDS`; safe from any thread or greenlet."""

    def __init__(
        self,
        report: Callable[[DelayReport], None],
        *,
        every: float = CONTROL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Report through ``report`` (``AdmissionQueue.report_delay`` under this process's name) every ``every`` s."""
        self._report = report
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._least: float | None = None
        self._samples = 0
        self._last = clock()

    def observe(self, sent_at: float | None) -> None:
        """Note that a task whose message was sent at ``sent_at`` (Unix time; None: a message without it)
        starts now; report when a report is due."""
        if sent_at is None:
            return
        now = self._clock()
        waited = min(max(0.0, now - sent_at), LONGEST_COUNTED_SECONDS)
        with self._lock:
            least = waited if self._least is None else min(self._least, waited)
            samples = self._samples + 1
            if now - self._last < self._every:
                self._least, self._samples = least, samples
                return
            self._least, self._samples, self._last = None, 0, now
        try:
            self._report(DelayReport(least=least, samples=samples, at=now))
        except redis.RedisError as exc:  # the scheduler then goes by the other workers' reports
            logger.debug("could not report dispatch delays: %s", exc)
