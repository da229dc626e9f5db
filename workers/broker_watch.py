"""BrokerWatch: what the reconciler asks of a Redis broker: did it lose its messages, how deep is a queue.

The broker keeps a sentinel key (``BROKER_SENTINEL_KEY``); the state store remembers that one was
set (``BROKER_EPOCH_SEEN_KEY``). A sentinel that vanished while the state store remembers it means
the broker restarted empty (or was flushed): every message it held is lost.
"""

from __future__ import annotations

from typing import Protocol

import redis

from shared.broker import queue_depth
from shared.state.keys import BROKER_EPOCH_SEEN_KEY, BROKER_SENTINEL_KEY
from shared.task_names import TASK_QUEUES, StepName, TaskBoundaries, step_queue, task_name

__all__ = ["BrokerWatch", "RedisBrokerWatch"]


class BrokerWatch(Protocol):
    """The reconciler's view of the broker."""

    def lost_messages(self) -> bool:
        """Whether the broker lost its messages since it was last asked."""

    def first_step_backlog(self) -> int:
        """Messages waiting in the queue of every turn's first step."""


class RedisBrokerWatch:
    """A :class:`BrokerWatch` of a Redis broker, remembering its sentinel in the state store's Redis."""

    def __init__(self, broker: redis.Redis, state: redis.Redis, *, owner: str, boundaries: TaskBoundaries) -> None:
        """Watch ``broker``, remembering in ``state`` that its sentinel was set; ``owner`` is the sentinel's value;
        ``boundaries`` (``APTIX_TASK_BOUNDARIES``) says which queue a turn's first step goes on."""
        self._broker = broker
        self._state = state
        self._owner = owner
        entry = StepName.REQUEST_HANDLER
        self._first_queues = sorted({TASK_QUEUES[task_name(entry)], step_queue(entry, boundaries)})
        """Where a first step may wait: its queue here, and its task's route (a sender set otherwise)."""

    def lost_messages(self) -> bool:
        """One broker round trip while the sentinel is there; two more to the state store when it was not."""
        if not self._broker.set(BROKER_SENTINEL_KEY, self._owner, nx=True):
            return False
        lost = bool(self._state.exists(BROKER_EPOCH_SEEN_KEY))
        self._state.set(BROKER_EPOCH_SEEN_KEY, b"1")
        return lost

    def first_step_backlog(self) -> int:
        """One broker round trip."""
        return queue_depth(self._broker, *self._first_queues)
