"""TurnPublisher: the port through which the gateway sends a turn's first step to the broker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from celery import Celery
from kombu.exceptions import BatchPublishError
from kombu.exceptions import OperationalError as BrokerError
from redis import RedisError

from shared.broker import publish_steps, send_step
from shared.models.envelope import TurnEnvelope
from shared.telemetry import active_tracing, turn_accepted

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

        The producer batches the messages (kombu's ``Producer.batch``: on Redis, one pipeline of
        ``LPUSH``es sent at the end), so a batch's 1,000 first messages cost one round trip, not 1,000.
        Without tracing, the messages are built and published without ``send_task``
        (``shared.broker.publish_steps``, a third of the CPU). With tracing on, they go through
        ``send_task``, and a turn's first message starts the turn's trace, unless the request that
        created the turn is that trace's root already (``shared.telemetry``).
        """
        with self._app.producer_or_acquire() as producer, producer.batch(max_size=max(len(envelopes), 1)):
            if active_tracing() is None:
                publish_steps(self._app, envelopes, producer=producer)
                return
            for envelope in envelopes:
                if envelope.round == 0 and envelope.hop == 0:
                    with turn_accepted(envelope.turn_id):
                        send_step(self._app, envelope, producer=producer, declare=False)
                else:
                    send_step(self._app, envelope, producer=producer, declare=False)
