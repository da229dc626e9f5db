"""Batch contracts: many turns submitted at once, and their progress."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.models.turn import TurnRequest, TurnStatus

__all__ = ["Batch", "BatchRequest", "BatchTurnRequest"]


class BatchTurnRequest(TurnRequest):
    """One request of a batch: a `TurnRequest` without `idempotency_key`."""

    idempotency_key: None = None
    """Not accepted inside a batch (any value but null is 422): a batch is recorded in one transaction,
    all of its requests or none, so there is nothing to deduplicate per request."""

    @field_validator("idempotency_key", mode="before")
    @classmethod
    def _no_idempotency_key(cls, value: object) -> None:
        if value is not None:
            raise ValueError("idempotency_key is not supported inside a batch")
        return None


class BatchRequest(BaseModel):
    """`POST /v1/batches`: the turns to run."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    requests: Annotated[list[BatchTurnRequest], Field(min_length=1, max_length=100_000)]
    """The turns to start, each as `POST /v1/turns` would (at most `APTIX_MAX_BATCH_REQUESTS`, default
    1000). No two may continue the same `session_id` (a session runs one turn at a time): 422. Every
    request is checked before any is recorded, and one refused request refuses the batch."""


class Batch(BaseModel):
    """A batch and its turns' counts by status."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    batch_id: str
    """The batch's id (`batch_…`)."""
    total: int
    """How many turns the batch has."""
    counts: dict[TurnStatus, int]
    """How many of its turns stand in each status (every status is listed, 0 included)."""
    created_at: datetime
    """When the batch was recorded (ISO 8601, UTC)."""
