"""Webhook contracts: a delivery of one event to one endpoint, and its attempts
(``GET /v1/webhook-deliveries``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

__all__ = ["DeliveryStatus", "WebhookAttempt", "WebhookDelivery", "WebhookDeliveryList"]


class DeliveryStatus(StrEnum):
    """Where a delivery stands."""

    PENDING = "pending"
    """Not delivered yet: its first attempt or a retry is due at ``next_attempt_at``."""
    DELIVERED = "delivered"
    """The endpoint answered 2xx."""
    FAILED = "failed"
    """Every attempt of the retry schedule failed; it is not tried again."""
    ENDPOINT_DISABLED = "endpoint_disabled"
    """The endpoint answered 410 Gone to this or an earlier delivery; nothing more is sent to it."""


class WebhookAttempt(BaseModel):
    """One POST of the event, and what became of it."""

    attempt: int
    at: datetime
    status_code: int | None = None
    """The endpoint's HTTP status; null when there was none (timeout, connection error, refused address)."""
    error: str | None = None
    """Why there is no status code, when there is none."""
    duration_ms: float | None = None


class WebhookDelivery(BaseModel):
    """One event (``delivery_id`` is its ``webhook-id``) and its delivery to one endpoint."""

    delivery_id: str
    event_type: str
    turn_id: str | None = None
    batch_id: str | None = None
    url: str
    status: DeliveryStatus
    created_at: datetime
    next_attempt_at: datetime | None = None
    """While pending: when the next attempt is due."""
    attempts: list[WebhookAttempt] = Field(default_factory=list)


class WebhookDeliveryList(BaseModel):
    """``GET /v1/webhook-deliveries``: oldest first."""

    deliveries: list[WebhookDelivery]
    has_more: bool = False
    """More deliveries match than ``limit`` allowed."""
