"""Pydantic wire models: what crosses HTTP, the broker and Redis."""

from shared.models.envelope import TurnEnvelope
from shared.models.session import ModeHistoryEntry, Session, SessionTurnSummary
from shared.models.turn import (
    ClientTool,
    ErrorBody,
    ModeChange,
    PendingToolCall,
    Turn,
    TurnHandle,
    TurnRequest,
    TurnStatus,
    Usage,
)

__all__ = [
    "ClientTool",
    "ErrorBody",
    "ModeChange",
    "ModeHistoryEntry",
    "PendingToolCall",
    "Session",
    "SessionTurnSummary",
    "Turn",
    "TurnEnvelope",
    "TurnHandle",
    "TurnRequest",
    "TurnStatus",
    "Usage",
]
