"""Batch contracts: many turns submitted at once, their progress, the cancel of a batch and the list of batches."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from shared.models.turn import NUL_FREE, TurnRequest, TurnStatus

__all__ = [
    "Batch",
    "BatchCancelRequest",
    "BatchList",
    "BatchRequest",
    "BatchStatus",
    "BatchTurnRequest",
    "RunningPolicy",
]

IdempotencyKey = Annotated[str, StringConstraints(min_length=1, max_length=255), NUL_FREE]
"""A client's idempotency key: 1 to 255 characters."""
RunningPolicy = Literal["finish", "cancel"]
"""What a batch's cancel does to its turns already running or paused: let them finish, or cancel them."""


class BatchTurnRequest(TurnRequest):
    """One request of a batch: a `TurnRequest`.

    Its `idempotency_key`, if any, names the turn as `POST /v1/turns` would: when an earlier turn of the
    organisation has that key and the same request, the batch reuses it (no new turn; it counts in the
    batch's `reused`, its counts and its results); with another request the batch is 409
    `idempotency_key_reused` naming the request's index. Two requests of one batch may not share a key (422).
    """


class BatchRequest(BaseModel):
    """`POST /v1/batches`: the turns to run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    requests: Annotated[list[BatchTurnRequest], Field(min_length=1, max_length=100_000)]
    """The turns to start, each as `POST /v1/turns` would (at most `APTIX_MAX_BATCH_REQUESTS`, default
    1000; larger batches as a JSON Lines upload). No two may continue the same `session_id` (a session
    runs one turn at a time): 422. Every request is checked before any is recorded, and one refused
    request refuses the batch."""
    webhook_url: Annotated[str, StringConstraints(max_length=2048), NUL_FREE] | None = None
    """Where the batch's `batch.completed` event is POSTed, signed; else the organisation's default. A
    public http(s) URL (422 `webhook_url_not_allowed` otherwise); the organisation needs a webhook secret
    (422 `webhook_not_configured`)."""
    idempotency_key: IdempotencyKey | None = None
    """Makes a retried POST safe: the same key with the same body (the key aside) from the same
    organisation answers 202 with the batch the first POST created, and records nothing; with another body
    it is 409 `idempotency_key_reused`. Also accepted as the `idempotency_key` query parameter."""

    @field_validator("webhook_url", "idempotency_key")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None


class BatchStatus(StrEnum):
    """Where a batch stands as a whole."""

    IN_PROGRESS = "in_progress"
    """Some of its turns have not ended, and no cancel was asked for."""
    CANCELLING = "cancelling"
    """A cancel was asked for; some turns still run (they finish, or stop, as the cancel said)."""
    CANCELLED = "cancelled"
    """A cancel was asked for and every turn has ended."""
    COMPLETED = "completed"
    """Every turn ended (completed, failed, cancelled one by one, or waiting for client tools), no cancel asked."""


class Batch(BaseModel):
    """A batch and its turns' counts by status."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    batch_id: str
    """The batch's id (`batch_…`)."""
    status: BatchStatus = BatchStatus.IN_PROGRESS
    """`in_progress`, `cancelling`, `cancelled` or `completed` (see `BatchStatus`)."""
    total: int
    """How many turns the batch has (its reused turns included)."""
    reused: int = 0
    """How many of its requests named an earlier turn by `idempotency_key`: that turn stands for the request."""
    counts: dict[TurnStatus, int]
    """How many of its turns stand in each status (every status is listed, 0 included)."""
    created_at: datetime
    """When the batch was recorded (ISO 8601, UTC)."""
    cancel_requested_at: datetime | None = None
    """When a cancel was asked for (`POST /v1/batches/{batch_id}/cancel`), else null."""


class BatchCancelRequest(BaseModel):
    """`POST /v1/batches/{batch_id}/cancel`: what to do with turns already running."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    running: RunningPolicy = "finish"
    """Turns not started yet are cancelled at once either way. `finish` (the default) lets running and
    paused turns end on their own; `cancel` cancels them as `POST /v1/turns/{turn_id}/cancel` would."""


class BatchList(BaseModel):
    """`GET /v1/batches`: a page of the organisation's batches, newest first (the OpenAI list shape)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    object: Literal["list"] = "list"
    """Always `list`."""
    data: list[Batch]
    """The batches of this page, newest first."""
    first_id: str | None
    """The first batch's id (null for an empty page)."""
    last_id: str | None
    """The last batch's id: pass it as `after` for the next page (null for an empty page)."""
    has_more: bool
    """Whether older batches follow."""
