"""Signed webhooks: configuration, endpoint checks and events, shared by the gateway and the workers."""

from shared.webhooks.addresses import Target, WebhookUrlError, check_endpoint
from shared.webhooks.config import WebhookConfig
from shared.webhooks.events import EventType
from shared.webhooks.sender import WebhookSender

__all__ = ["EventType", "Target", "WebhookConfig", "WebhookSender", "WebhookUrlError", "check_endpoint"]
