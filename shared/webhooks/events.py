"""Webhook events: their types and the JSON body every delivery of one event carries, unchanged.

``{"id": "msg_…", "type": "turn.completed", "timestamp": "ISO 8601", "data": {…}}``: ``id`` is also
the ``webhook-id`` header (one per event, the same on every attempt), ``data`` the Turn exactly as
``GET /v1/turns/{turn_id}`` returns it at the event, or for ``batch.completed`` the Batch as
``GET /v1/batches/{batch_id}`` returns it.

A turn created through the OpenAI face (``TurnExtras.face == "openai"``) raises OpenAI's event
instead, so that ``OpenAI().webhooks.unwrap`` parses it: ``{"id": "evt_…", "type":
"response.completed", "created_at": <Unix seconds>, "data": {"id": "resp_…"}}``, the response being
the turn's round at the event (``shared.openai.ids``). A paused round is a completed response (its
output ends in ``function_call`` items), so it raises ``response.completed`` too. Its ``id`` is its
``webhook-id`` as well.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from shared.models.turn import TurnStatus
from shared.openai import FACE_OPENAI

__all__ = ["EventType", "event_body", "new_delivery_id", "object_event_body", "response_event_body", "turn_event_type"]


class EventType(StrEnum):
    """What happened."""

    TURN_COMPLETED = "turn.completed"
    TURN_FAILED = "turn.failed"
    TURN_CANCELLED = "turn.cancelled"
    TURN_REQUIRES_CLIENT_TOOLS = "turn.requires_client_tools"
    """The turn paused: the client runs ``pending_tool_calls`` and posts their results."""
    BATCH_COMPLETED = "batch.completed"
    """None of the batch's turns is queued or running any more (sent once per batch)."""
    RESPONSE_COMPLETED = "response.completed"
    """A response of the OpenAI face completed, or paused ending in ``function_call`` items."""
    RESPONSE_FAILED = "response.failed"
    """A response of the OpenAI face failed."""
    RESPONSE_CANCELLED = "response.cancelled"
    """A response of the OpenAI face was cancelled."""
    RESPONSE_INCOMPLETE = "response.incomplete"
    """OpenAI's event of a response cut short; no turn status raises it today (a type for completeness)."""
    BATCH_FAILED = "batch.failed"
    """A batch of the OpenAI face failed validation (nothing of it ran)."""
    BATCH_CANCELLED = "batch.cancelled"
    """A batch of the OpenAI face was cancelled and none of its requests is queued or running any more."""
    BATCH_EXPIRED = "batch.expired"
    """A batch of the OpenAI face ran out of its completion window; its unfinished requests were cancelled."""


_OF_STATUS = {
    TurnStatus.COMPLETED: EventType.TURN_COMPLETED,
    TurnStatus.FAILED: EventType.TURN_FAILED,
    TurnStatus.CANCELLED: EventType.TURN_CANCELLED,
    TurnStatus.REQUIRES_CLIENT_TOOLS: EventType.TURN_REQUIRES_CLIENT_TOOLS,
}


_OF_STATUS_OPENAI = {
    TurnStatus.COMPLETED: EventType.RESPONSE_COMPLETED,
    TurnStatus.REQUIRES_CLIENT_TOOLS: EventType.RESPONSE_COMPLETED,
    TurnStatus.FAILED: EventType.RESPONSE_FAILED,
    TurnStatus.CANCELLED: EventType.RESPONSE_CANCELLED,
}


def turn_event_type(status: TurnStatus, *, face: str | None = None) -> EventType | None:
    """The event a turn committed in ``status`` raises; None while it is queued or running.

    Args:
        status: the status just committed.
        face: the face that recorded the turn (``TurnExtras.face``): ``openai`` for OpenAI's event
            types, anything else for ours.

    Returns:
        The event's type, or None.
    """
    return (_OF_STATUS_OPENAI if face == FACE_OPENAI else _OF_STATUS).get(status)


def new_delivery_id(*, face: str | None = None) -> str:
    """A fresh event (and delivery) id, the ``webhook-id`` header: ``msg_`` and 32 hex digits, or ``evt_``
    (OpenAI's event ids) for an event of a turn of the OpenAI face."""
    prefix = "evt" if face == FACE_OPENAI else "msg"
    return f"{prefix}_{uuid.uuid4().hex}"


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


def object_event_body(delivery_id: str, event: EventType, *, object_id: str, at: datetime) -> str:
    """The JSON text of an event of the OpenAI face (``response.*`` or ``batch.*``), as every attempt sends it.

    Args:
        delivery_id: the event's id (``evt_…``).
        event: its type.
        object_id: the response (``resp_…``) or batch (``batch_…``) it is about.
        at: when it happened (sent as whole Unix seconds).

    Returns:
        Compact JSON: ``{"id", "type", "created_at", "data": {"id"}, "object": "event"}``.
    """
    body = {
        "id": delivery_id, "type": event.value, "created_at": int(at.timestamp()), "data": {"id": object_id},
        "object": "event",
    }  # fmt: skip
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def response_event_body(delivery_id: str, event: EventType, *, response_id: str, at: datetime) -> str:
    """The JSON text of an event of the OpenAI face, as every attempt sends (and signs) it.

    Args:
        delivery_id: the event's id (``evt_…``).
        event: its type (``response.*``).
        response_id: the response it is about (``resp_…``: the turn's round).
        at: when it happened (sent as whole Unix seconds).

    Returns:
        Compact JSON.
    """
    body = {"id": delivery_id, "type": event.value, "created_at": int(at.timestamp()), "data": {"id": response_id}}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
