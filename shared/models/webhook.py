"""Webhook contracts: a delivery of one event to one endpoint, and its attempts
(``GET /v1/webhook-deliveries``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DeliveryStatus",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookDeliveryList",
    "WebhookEndpoint",
    "WebhookEndpointList",
]


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

    model_config = ConfigDict(use_attribute_docstrings=True)

    attempt: int
    """Its number: 1 for the first POST, then one more per retry."""
    at: datetime
    """When it was made (ISO 8601, UTC)."""
    status_code: int | None = None
    """The endpoint's HTTP status; null when there was none (timeout, connection error, refused address)."""
    error: str | None = None
    """Why there is no status code, when there is none."""
    duration_ms: float | None = None
    """How long the endpoint took to answer, or until the attempt gave up."""


class WebhookDelivery(BaseModel):
    """One event (``delivery_id`` is its ``webhook-id``) and its delivery to one endpoint."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    delivery_id: str
    """The event's id (`msg_…`; `evt_…` for a response of `/openai/v1`), sent as its `webhook-id` on every
    attempt (receivers de-duplicate on it)."""
    event_type: str
    """`turn.completed`, `turn.failed`, `turn.cancelled`, `turn.requires_client_tools` or `batch.completed`;
    for a turn created through `/openai/v1`, OpenAI's `response.completed` (also when it paused for
    function calls), `response.failed`, `response.cancelled` or `response.incomplete`."""
    turn_id: str | None = None
    """The turn the event is about (null for a batch's event)."""
    batch_id: str | None = None
    """The batch the event is about, or the turn's batch."""
    url: str
    """Where it is POSTed."""
    status: DeliveryStatus
    """`pending`, `delivered`, `failed` or `endpoint_disabled`."""
    created_at: datetime
    """When the event was recorded (ISO 8601, UTC)."""
    next_attempt_at: datetime | None = None
    """While pending: when the next attempt is due."""
    attempts: list[WebhookAttempt] = Field(default_factory=list)
    """Every attempt so far, oldest first."""


class WebhookDeliveryList(BaseModel):
    """``GET /v1/webhook-deliveries``: oldest first."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    deliveries: list[WebhookDelivery]
    """The deliveries, oldest first (at most `limit`)."""
    has_more: bool = False
    """More deliveries match than ``limit`` allowed."""


class WebhookEndpoint(BaseModel):
    """An endpoint the organisation's events go to, and whether Aptix sends to it."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str
    """The endpoint."""
    state: Literal["enabled", "disabled"]
    """`disabled`: it answered 410 Gone; its events are recorded `endpoint_disabled` and not sent, until the
    operator runs `aptix webhooks enable --org ORG URL`."""
    disabled_at: datetime | None = None
    """When it was disabled (null while enabled)."""
    disabled_reason: str | None = None
    """Why (which delivery got the 410), while disabled."""
    default: bool = False
    """Whether it is the organisation's default endpoint (`APTIX_WEBHOOK_DEFAULT_URLS`)."""
    deliveries: int = 0
    """Deliveries recorded for it, of any status."""
    last_event_at: datetime | None = None
    """When the newest of them was recorded."""


class WebhookEndpointList(BaseModel):
    """The organisation's webhook endpoints (``GET /v1/webhook-endpoints``), by URL."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    endpoints: list[WebhookEndpoint]
    """The URLs its deliveries named, the disabled ones and its default, each once."""
    signed: bool
    """Whether the organisation has a signing secret now (without one it gets no webhooks)."""
