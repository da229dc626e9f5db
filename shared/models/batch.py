"""Batch contracts: many turns submitted at once, and their progress."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from shared.models.turn import TurnRequest, TurnStatus

__all__ = ["Batch", "BatchRequest"]


class BatchRequest(BaseModel):
    """``POST /v1/batches``: the turns to run (the gateway enforces ``APTIX_MAX_BATCH_REQUESTS``)."""

    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[TurnRequest], Field(min_length=1, max_length=100_000)]
    webhook_url: Annotated[str, StringConstraints(max_length=2048)] | None = None
    """Where the batch's ``batch.completed`` event is POSTed, signed; else the organisation's default."""

    @field_validator("webhook_url")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None


class Batch(BaseModel):
    """A batch and its turns' counts by status."""

    batch_id: str
    total: int
    counts: dict[TurnStatus, int]
    created_at: datetime
