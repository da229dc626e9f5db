"""Pydantic wire models: what crosses HTTP, the broker and Redis."""

from shared.models.envelope import TurnEnvelope
from shared.models.error import ErrorBody, ErrorDetail, ProblemDetail
from shared.models.session import ModeHistoryEntry, Session, SessionTurnSummary
from shared.models.turn import (
    ClientTool,
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
    "ErrorDetail",
    "ModeChange",
    "ModeHistoryEntry",
    "PendingToolCall",
    "ProblemDetail",
    "Session",
    "SessionTurnSummary",
    "Turn",
    "TurnEnvelope",
    "TurnHandle",
    "TurnRequest",
    "TurnStatus",
    "Usage",
]
