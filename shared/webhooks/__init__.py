"""Signed webhooks: configuration, endpoint checks and events, shared by the gateway and the workers."""

from shared.webhooks.addresses import Target, WebhookUrlError, check_endpoint
from shared.webhooks.config import WebhookConfig
from shared.webhooks.events import EventType

__all__ = ["EventType", "Target", "WebhookConfig", "WebhookUrlError", "check_endpoint"]
