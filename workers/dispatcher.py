"""Dispatcher: sends a turn's next message now, after a short countdown, or parks a long wait in Redis.

Celery's countdown on the Redis transport is held by a worker, unacknowledged, until it is due; one
longer than the broker's visibility timeout is delivered a second time. Waits longer than half the
visibility timeout (a model outage, a long Retry-After) are therefore parked in the state store and
sent when due by :meth:`Dispatcher.release_due`, which every reconciler thread runs about once a
second. A parked message lost with Redis is recovered like any lost message: the turn's in-flight
marker lapses and the reconciler re-drives it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.state import Timers
from workers.retry import park_after

__all__ = ["Dispatcher", "SendStep"]

logger = logging.getLogger(__name__)

SendStep = Callable[[TurnEnvelope, float], None]
"""Publishes one step message with a countdown in seconds (0: at once)."""


class Dispatcher:
    """Routes each outgoing message to the broker or to the parked timers."""

    def __init__(self, send: SendStep, store: Timers, *, park_after: float) -> None:
        """Build the dispatcher.

        Args:
            send: publishes a message on the broker.
            store: where long waits are parked.
            park_after: countdowns longer than this many seconds are parked.
        """
        self._send = send
        self._store = store
        self._park_after = park_after

    @property
    def park_after(self) -> float:
        """Countdowns longer than this many seconds are parked rather than given to the broker."""
        return self._park_after

    @classmethod
    def for_settings(cls, send: SendStep, store: Timers, settings: Settings) -> Dispatcher:
        """A dispatcher that parks the waits the retry policy says to park (:func:`workers.retry.park_after`)."""
        return cls(send, store, park_after=park_after(settings))

    def dispatch(self, envelope: TurnEnvelope, countdown: float, *, now: float) -> None:
        """Send ``envelope`` after ``countdown`` seconds (``now`` is the Unix time)."""
        if countdown > self._park_after:
            self._store.park(envelope.model_dump_json(), due=now + countdown)
        else:
            self._send(envelope, countdown)

    def release_due(self, *, now: float) -> int:
        """Send the parked messages that are due; returns how many were sent."""
        sent = 0
        for raw in self._store.pop_due(now=now):
            try:
                envelope = TurnEnvelope.model_validate_json(raw)
            except ValueError:
                logger.error("dropping a parked message that is not an envelope: %.200s", raw)
                continue
            try:
                self._send(envelope, 0.0)
            except Exception:
                self._store.park(raw, due=now)  # keep it for the next round; the broker is down
                raise
            sent += 1
        if sent:
            logger.info("sent %d parked message(s) that were due", sent)
        return sent
