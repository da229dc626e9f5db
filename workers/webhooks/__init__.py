"""Signed webhook delivery: one attempt per task, retries, the sweep that sends what is due."""

from workers.webhooks.delivery import WebhookDeliverer
from workers.webhooks.sweep import WebhookSweeper

__all__ = ["WebhookDeliverer", "WebhookSweeper"]
