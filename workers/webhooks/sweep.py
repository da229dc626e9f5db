"""WebhookSweeper: sends the webhook deliveries that are due and that no message is carrying.

A delivery is recorded in the transaction that raised its event and enqueued after it, best effort:
if the process died in between, or the broker refused, nothing carries it. A retry whose wait was
longer than a countdown may safely be is parked in the database. An attempt whose worker died leaves
its claim behind. The active reconciler runs :meth:`WebhookSweeper.sweep` at each scan and sends
each of them when due; a delivery it sends is not due again for a while, so a message waiting behind
a backlog is not sent twice a scan (and if it was, the claim makes one attempt of the two).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from shared.db.webhook_deliveries import WebhookDeliveryRepository
from workers.webhooks.delivery import SendAttempt

__all__ = ["WebhookSweeper"]

logger = logging.getLogger(__name__)

_GRACE_SECONDS = 10.0
"""How overdue a delivery must be before the sweep sends it: its own message is usually on the way."""
_RESEND_SECONDS = 300.0
"""A delivery the sweep sent is due again this much later if no attempt was made meanwhile."""


class WebhookSweeper:
    """Finds due webhook deliveries and sends their next attempt."""

    def __init__(self, deliveries: WebhookDeliveryRepository, send: SendAttempt) -> None:
        """Build the sweeper.

        Args:
            deliveries: the deliveries' repository.
            send: sends an attempt to the webhooks queue.
        """
        self._deliveries = deliveries
        self._send = send

    def sweep(self, now: datetime) -> int:
        """Send every delivery overdue at ``now``; how many were sent.

        Raises:
            Exception: the database or the broker failed (the reconciler logs it and tries again).
        """
        due = self._deliveries.due(
            before=now - timedelta(seconds=_GRACE_SECONDS), resend_at=now + timedelta(seconds=_RESEND_SECONDS)
        )
        for delivery_id, attempt in due:
            self._send(delivery_id, attempt, 0.0)
        if due:
            logger.info("sent %d webhook delivery attempt(s) that were due", len(due))
        return len(due)
