"""WebhookSender: hands the webhook deliveries a committed write recorded to the webhooks queue.

The second half of the outbox (``shared.db.webhook_outbox``): a repository records a turn's webhook
event in the transaction that ends or pauses it and returns the new deliveries' ids; once that
transaction committed, whoever made the write sends their first attempts here (the worker driver
after a ``persist`` step, ``shared.turn_ending`` after an early end). Best effort: a delivery that
cannot be enqueued now stays pending, and the reconciler's sweep (``workers.webhooks.sweep``) sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

__all__ = ["SendDelivery", "WebhookSender"]

logger = logging.getLogger(__name__)

SendDelivery = Callable[[str], None]
"""Sends the first attempt of a delivery, by id, to the webhooks queue (``shared.broker.send_webhook``)."""


class WebhookSender:
    """Sends the first attempt of each delivery it is given; never raises."""

    def __init__(self, send: SendDelivery) -> None:
        """Build the sender on ``send``, which enqueues one delivery's first attempt."""
        self._send = send

    def send(self, delivery_ids: Sequence[str]) -> None:
        """Enqueue each delivery's first attempt (after the commit that recorded it); never raises.

        A delivery that cannot be enqueued now stays pending: the sweep sends it.
        """
        for delivery_id in delivery_ids:
            try:
                self._send(delivery_id)
            except Exception as exc:  # the broker, a connection: whatever it is, the sweep catches up
                logger.warning(
                    "could not enqueue webhook delivery %s (%s: %s); the sweep sends it",
                    delivery_id, type(exc).__name__, exc,
                )  # fmt: skip
