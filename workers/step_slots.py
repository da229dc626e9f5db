"""StepSlots: how many tasks of a gevent worker process run pipeline steps at once, interactive turns first.

With ``APTIX_TASK_BOUNDARIES=call`` the pipeline's own steps after a model call (the reasoner, the
persistence) run in the model call's task, in the ``llm`` worker's gevent pool, which holds hundreds of
tasks at once. Their work is CPU and short database and Redis round trips; gevent's hub resumes the
greenlets in the order they became ready, so with a batch's steps all runnable together an interactive
turn's step waits behind every one of them at each round trip. The slots bound how many tasks run those
steps together (their save included) and let a waiting task of a lower priority number (an interactive
turn: ``shared.models.envelope``'s priorities, 0 first) in before any batch turn's; tasks of one priority
go in the order they came. A threads pool bounds itself by its thread count, and has no slots.

Built on ``threading``, which gevent's monkey-patching makes cooperative.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["StepSlots", "green"]


class StepSlots:
    """``slots`` places for running pipeline steps, given to waiting tasks by priority, then in order of arrival."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a step needs at least one slot, not {slots}")
        self._free = slots
        self._changed = threading.Condition()
        self._waiting: list[tuple[int, int]] = []
        """(priority, arrival) of the tasks waiting, a heap: the first is let in next."""
        self._arrivals = itertools.count()

    @contextmanager
    def held(self, priority: int) -> Iterator[None]:
        """Run the body in a slot, after every task waiting with a lower priority number or the same one before it."""
        with self._changed:
            ticket = (priority, next(self._arrivals))
            if self._free and not self._waiting:
                self._free -= 1
            else:
                heapq.heappush(self._waiting, ticket)
                self._changed.wait_for(lambda: self._free > 0 and self._waiting[0] == ticket)
                heapq.heappop(self._waiting)
                self._free -= 1
                if self._free and self._waiting:
                    self._changed.notify_all()  # the next in line may go too
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                if self._waiting:
                    self._changed.notify_all()


def green() -> bool:
    """Whether this process runs on gevent's hub (Celery's gevent pool patched ``threading``)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))
