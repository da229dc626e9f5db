"""TurnPublisher: the port through which the gateway sends a turn's first step to the broker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from celery import Celery
from kombu.exceptions import BatchPublishError
from kombu.exceptions import OperationalError as BrokerError
from redis import RedisError

from shared.broker import send_steps
from shared.models.envelope import TurnEnvelope

__all__ = ["PUBLISH_ERRORS", "CeleryPublisher", "TurnPublisher"]

PUBLISH_ERRORS: tuple[type[Exception], ...] = (BrokerError, BatchPublishError, RedisError, OSError)
"""What a refusing broker (or state store) raises: the turn is then not recorded."""


class TurnPublisher(Protocol):
    """Sends envelopes to the pipeline, by task name."""

    def publish(self, envelopes: Sequence[TurnEnvelope]) -> None:
        """Send each envelope's step.

        Raises:
            Exception: one of :data:`PUBLISH_ERRORS` when the broker refuses.
        """


class CeleryPublisher:
    """A TurnPublisher on the gateway's producer-only Celery app (one pooled connection per call)."""

    def __init__(self, producer: Celery) -> None:
        self._app = producer

    def publish(self, envelopes: Sequence[TurnEnvelope]) -> None:
        """Send each envelope's step through one producer from the pool, in one broker round trip.

        See ``shared.broker.send_steps``: without tracing, Celery's messages are published without
        ``send_task``; with tracing, a turn's first message starts the turn's trace, unless the request
        that created the turn is that trace's root already (``shared.telemetry``).
        """
        send_steps(self._app, envelopes, start_traces=True)
