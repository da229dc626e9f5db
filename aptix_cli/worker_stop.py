"""How a Celery process of ``aptix worker`` stops: within ``APTIX_WORKER_STOP_SECONDS``, whatever holds it.

Celery's warm shutdown (SIGTERM, SIGINT) lets the tasks in hand finish and waits as long as that
takes, and with the broker unreachable neither it nor a cold shutdown (SIGQUIT, a second SIGINT)
ever ends: the worker's heartbeat event retries its publish forever while holding the lock that
closing the event dispatcher waits for (seen with a gevent ``llm`` process: SIGTERM ignored for
minutes). Every task is acknowledged late, so a message a stop cuts off is redelivered to another
worker: a stop has no reason to wait without bound.

So each Celery process that ``aptix worker`` runs arms a :class:`StopDeadline` when Celery starts
a shutdown (its ``worker_shutting_down`` signal): ``APTIX_WORKER_STOP_SECONDS`` after a warm
shutdown begins, at most :data:`COLD_STOP_SECONDS` after a cold one. A process still running at
the deadline logs why and ends itself (``os._exit``; a prefork pool's children die with it). The
deadline is watched from an operating-system thread, even under gevent, so a stuck event loop
cannot hold it. The parent of several processes (``aptix_cli.worker_group``) passes the stop on and
kills what remains :data:`KILL_MARGIN_SECONDS` later.
"""

from __future__ import annotations

import _thread
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["COLD_STOP_SECONDS", "EXIT_CODE", "KILL_MARGIN_SECONDS", "StopDeadline", "arm_on_shutdown"]

logger = logging.getLogger(__name__)

COLD_STOP_SECONDS = 5.0
"""A cold shutdown (SIGQUIT, a second SIGINT) ends the process within this long (or sooner, by the warm deadline)."""
KILL_MARGIN_SECONDS = 2.0
"""How long after the deadline the parent of several processes kills a child that has not ended itself."""
EXIT_CODE = 1
"""The exit code of a process that ended itself at its deadline."""
_TICK_SECONDS = 0.2
_FAREWELL_SECONDS = 1.0
"""How long the last log line may take to write (a full stderr pipe must not hold the exit)."""


class StopDeadline:
    """The deadline of one process's stop, and the thread that ends the process when it passes.

    Args:
        stop_seconds: ``APTIX_WORKER_STOP_SECONDS``.
        clock: seconds, monotonic.
        sleep: sleeps without yielding to an event loop.
        start_thread: starts a function on an operating-system thread.
        end: ends the process with an exit code (``os._exit``).
    """

    def __init__(
        self,
        stop_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        start_thread: Callable[[Callable[[], None]], object] | None = None,
        end: Callable[[int], object] = os._exit,
    ) -> None:
        native = _Native()
        self._stop_seconds = stop_seconds
        self._clock = clock
        self._sleep = sleep or native.sleep
        self._start_thread = start_thread or native.start
        self._lock = native.lock
        self._end = end
        self._started_at: float | None = None
        self.deadline: float | None = None
        """When the process ends (``clock`` seconds); None until a stop is requested."""

    def request(self, how: str) -> float:
        """Note a shutdown Celery has begun; the first starts the watch. Reads the clock.

        Args:
            how: Celery's ``"Warm"`` or ``"Cold"``.

        Returns:
            The deadline: ``stop_seconds`` after the first request, brought forward to at most
            :data:`COLD_STOP_SECONDS` from now by a cold one; never later than before.
        """
        now = self._clock()
        allowed = self._stop_seconds if how != "Cold" else min(self._stop_seconds, COLD_STOP_SECONDS)
        first = self.deadline is None
        self.deadline = now + allowed if self.deadline is None else min(self.deadline, now + allowed)
        if first:
            self._started_at = now
            logger.info(
                "worker stopping (%s shutdown): the tasks in hand have %gs to finish, then this process ends "
                "(APTIX_WORKER_STOP_SECONDS; unacknowledged messages are redelivered)",
                how.lower(),
                allowed,
            )
            self._start_thread(self.watch)
        return self.deadline

    def watch(self) -> None:
        """Wait for the deadline, then log and end the process (on the thread :meth:`request` started)."""
        assert self.deadline is not None and self._started_at is not None
        while (left := self.deadline - self._clock()) > 0:
            self._sleep(min(_TICK_SECONDS, left))
        waited = self._clock() - self._started_at
        written = self._lock()
        written.acquire()

        def farewell() -> None:
            try:
                logger.warning(
                    "worker still stopping %.1fs after it was told to (tasks in hand, or an unreachable broker): "
                    "ending it now; its unacknowledged messages will be redelivered",
                    waited,
                )
            finally:
                written.release()

        self._start_thread(farewell)
        written.acquire(timeout=_FAREWELL_SECONDS)
        self._end(EXIT_CODE)


def arm_on_shutdown(stop_seconds: float) -> StopDeadline:
    """Arm a :class:`StopDeadline` on each shutdown Celery begins in this process (``worker_shutting_down``).

    Only a command-line worker sends that signal (it comes from the signal handlers Celery installs),
    so a worker embedded in another process (``aptix dev``) is never ended by it.
    """
    from celery import signals

    deadline = StopDeadline(stop_seconds)

    def on_shutting_down(how: Any = None, **_kwargs: Any) -> None:
        deadline.request(str(how))

    signals.worker_shutting_down.connect(on_shutting_down, weak=False, dispatch_uid="aptix-stop-deadline")
    return deadline


class _Native:
    """Threads, locks and sleep of the operating system, also in a process gevent patched (whose
    greenlets run only while its event loop does)."""

    def __init__(self) -> None:
        if "gevent.monkey" in sys.modules:
            from gevent import monkey

            originals = monkey.get_original("_thread", ["start_new_thread", "allocate_lock"])
            self._start_new_thread, self.lock = originals
            self.sleep: Callable[[float], None] = monkey.get_original("time", "sleep")
        else:
            self._start_new_thread, self.lock = _thread.start_new_thread, _thread.allocate_lock
            self.sleep = time.sleep

    def start(self, function: Callable[[], None]) -> object:
        return self._start_new_thread(function, ())
