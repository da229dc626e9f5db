"""Session contracts: a session, its mode history and its turns."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.models.turn import TurnStatus

__all__ = ["ModeHistoryEntry", "Session", "SessionTurnSummary"]


class ModeHistoryEntry(BaseModel):
    """One persisted mode transition."""

    model_config = ConfigDict(populate_by_name=True, use_attribute_docstrings=True)

    from_mode: str | None = Field(alias="from")
    """The mode before the change (null for the session's first mode)."""
    to_mode: str = Field(alias="to")
    """The mode after the change."""
    at: datetime
    """When the change was recorded (ISO 8601, UTC)."""
    reason: str | None = None
    """Why the mode changed, as the model said."""
    user_id: str | None = None
    """The user whose turn changed the mode."""
    turn_id: str | None = None
    """The turn during which the mode changed."""


class SessionTurnSummary(BaseModel):
    """A turn as listed on its session."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    turn_id: str
    """The turn's id (`turn_…`)."""
    status: TurnStatus
    """Where the turn stands."""
    created_at: datetime
    """When the turn was created (ISO 8601, UTC)."""


class Session(BaseModel):
    """`GET /v1/sessions/{session_id}`: readable as soon as `POST /v1/turns` returned its id."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    session_id: str
    """The session's id (`sess_…`)."""
    mode: str
    """The session's current mode (until its first turn ran: the requested or default one)."""
    created_at: datetime
    """When the session was created (ISO 8601, UTC)."""
    updated_at: datetime
    """When the session last changed (ISO 8601, UTC)."""
    mode_history: list[ModeHistoryEntry] = Field(default_factory=list)
    """Every mode transition, oldest first."""
    turns: list[SessionTurnSummary] = Field(default_factory=list)
    """The session's turns, oldest first."""
