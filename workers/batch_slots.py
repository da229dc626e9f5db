"""BatchSlots: how many batch turns' tasks a gevent worker process runs at once; an interactive turn's never waits.

A gevent process (the ``llm`` pool) holds every model call in flight, hundreds of tasks at once. With
``APTIX_TASK_BOUNDARIES=call`` their tasks also run the pipeline's steps after the call (the reasoner,
the persistence): CPU and short Redis and database round trips. gevent's hub resumes the greenlets in
the order they became ready, so while a batch keeps the process busy an interactive turn's task waits
behind every runnable batch task at each of its round trips: the broker's priorities end at the
worker's door.

The slots bound the batch tasks that run at once (``APTIX_GEVENT_BATCH_SLOTS``): a batch task takes
one before its first round trip and gives it back when it ends, and gives it up meanwhile while it
waits for the model's answer (:meth:`BatchSlots.released`), so the bound is on the tasks that want the
CPU, not on the calls in flight. A batch task past the bound waits on the slots (not runnable, out of
the hub's way) in the order it came. An interactive turn's task takes no slot: it runs at once, behind
at most the slots' tasks at each round trip. A threads pool is bounded by its threads, and has no slots.

Built on ``threading``, which gevent's monkey-patching makes cooperative (and its ``local`` per greenlet).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from shared.models.envelope import INTERACTIVE_PRIORITY

__all__ = ["BatchSlots", "green"]


class BatchSlots:
    """``slots`` places for batch turns' tasks in one process; a task of an interactive turn needs none."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"batch tasks need at least one slot, not {slots}")
        self._slots = threading.Semaphore(slots)
        self._task = threading.local()
        """``holding``: whether the running task holds a slot (per greenlet once gevent patched ``threading``)."""

    @contextmanager
    def held(self, priority: int) -> Iterator[None]:
        """Run a task of a turn of ``priority`` (its envelope's): a batch turn's in a slot, another at once."""
        if priority <= INTERACTIVE_PRIORITY:
            yield
            return
        self._slots.acquire()
        self._task.holding = True
        try:
            yield
        finally:
            self._task.holding = False
            self._slots.release()

    @contextmanager
    def released(self) -> Iterator[None]:
        """Wait on the world outside (the model's answer) without the slot, and take one again after; a task that holds
        none (an interactive turn's, or none of this process's) just waits."""
        if not self.holding():
            yield
            return
        self._task.holding = False
        self._slots.release()
        try:
            yield
        finally:
            self._slots.acquire()
            self._task.holding = True

    def holding(self) -> bool:
        """Whether the running task holds a slot."""
        return bool(getattr(self._task, "holding", False))


def green() -> bool:
    """Whether this process runs on gevent's hub (Celery's gevent pool patched ``threading``)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))
