"""Webhook events: their types and the JSON body every delivery of one event carries, unchanged.

``{"id": "msg_…", "type": "turn.completed", "timestamp": "ISO 8601", "data": {…}}``: ``id`` is also
the ``webhook-id`` header (one per event, the same on every attempt), ``data`` the Turn exactly as
``GET /v1/turns/{turn_id}`` returns it at the event, or for ``batch.completed`` the Batch as
``GET /v1/batches/{batch_id}`` returns it.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from shared.models.turn import TurnStatus

__all__ = ["EventType", "event_body", "new_delivery_id", "turn_event_type"]


class EventType(StrEnum):
    """What happened."""

    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TURN_CANCELLED = "turn.cancelled"
    TURN_REQUIRES_CLIENT_TOOLS = "turn.requires_client_tools"
    """The turn paused: the client runs ``pending_tool_calls`` and posts their results."""
    BATCH_COMPLETED = "batch.completed"
    """None of the batch's turns is queued or running any more (sent once per batch)."""


_OF_STATUS = {
    TurnStatus.COMPLETED: EventType.TURN_COMPLETED,
    TurnStatus.FAILED: EventType.TURN_FAILED,
    TurnStatus.CANCELLED: EventType.TURN_CANCELLED,
    TurnStatus.REQUIRES_CLIENT_TOOLS: EventType.TURN_REQUIRES_CLIENT_TOOLS,
}


def turn_event_type(status: TurnStatus) -> EventType | None:
    """The event a turn committed in ``status`` raises; None while it is queued or running."""
    return _OF_STATUS.get(status)


def new_delivery_id() -> str:
    """A fresh event (and delivery) id, the ``webhook-id`` header: ``msg_`` and 32 hex digits."""
    return f"msg_{uuid.uuid4().hex}"


def event_body(delivery_id: str, event: EventType, data: dict[str, Any], *, at: datetime) -> str:
    """The JSON text of an event, as every attempt sends (and signs) it.

    Args:
        delivery_id: the event's id.
        event: its type.
        data: the Turn or Batch, JSON-ready.
        at: when it happened.

    Returns:
        Compact JSON.
    """
    body = {"id": delivery_id, "type": event.value, "timestamp": at.isoformat(), "data": data}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
