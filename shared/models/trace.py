"""CompositionTrace (AGN-031 §9): ordered, lightweight records of what a turn did."""

from __future__ import annotations

from datetime import datetime
from enum import IntEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ExitMode", "TraceStep", "TurnTrace"]


class ExitMode(IntEnum):
    """How the reasoner ended a turn's run (AGN-031 exit modes); the ``exit`` trace record carries the integer."""

    COMPLETED = 1
    """Exit 1: the model answered; the turn is committed ``completed``."""
    AWAITING_CLIENT_TOOLS = 2
    """Exit 2: the model called client tools; the turn is committed ``requires_client_tools`` and
    resumes when their results are posted."""


class TraceStep(BaseModel):
    """One trace record."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    seq: int
    """The record's position in the turn's trace, from 1."""
    kind: str
    """turn_start, session_created, session_restored, llm_call, tool_execution, mode_change, ..."""
    at: datetime
    """When it was recorded (ISO 8601, UTC)."""
    step: str
    """The pipeline step that recorded it."""
    worker: str
    """The host that ran the step."""
    duration_ms: float | None = None
    """How long the recorded work took, in milliseconds, where it has a duration."""
    data: dict[str, Any] = Field(default_factory=dict)
    """The record's own fields, by kind (model, tokens, tool name and outcome, modes, ...)."""


class TurnTrace(BaseModel):
    """`GET /v1/turns/{turn_id}/trace`: the live trace while the turn runs, else the committed one."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    turn_id: str
    """The turn's id (`turn_…`)."""
    steps: list[TraceStep]
    """The trace records, in order."""
