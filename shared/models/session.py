"""Session contracts: a session, its mode history and its turns."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.models.turn import TurnStatus

__all__ = ["ModeHistoryEntry", "Session", "SessionTurnSummary"]


class ModeHistoryEntry(BaseModel):
    """One persisted mode transition."""

    model_config = ConfigDict(populate_by_name=True)

    from_mode: str | None = Field(alias="from")
    to_mode: str = Field(alias="to")
    at: datetime
    reason: str | None = None
    user_id: str | None = None
    turn_id: str | None = None


class SessionTurnSummary(BaseModel):
    """A turn as listed on its session."""

    turn_id: str
    status: TurnStatus
    created_at: datetime


class Session(BaseModel):
    """``GET /v1/sessions/{session_id}``."""

    session_id: str
    mode: str
    created_at: datetime
    updated_at: datetime
    mode_history: list[ModeHistoryEntry] = Field(default_factory=list)
    turns: list[SessionTurnSummary] = Field(default_factory=list)
