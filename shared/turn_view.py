"""The API view of a recorded turn: ``TurnRecord`` in, the ``Turn`` wire model out.

The gateway answers with it, and a webhook event carries it: both say the same of a turn.
"""

from __future__ import annotations

from shared.db.records import TurnRecord
from shared.models.turn import ModeChange, PendingToolCall, Turn, Usage
from shared.result import ErrorInfo

__all__ = ["to_turn"]


def to_turn(record: TurnRecord) -> Turn:
    """The API view of a turn.

    Args:
        record: the turn as the repository read it.

    Returns:
        The ``Turn`` the HTTP API answers with; its mode is the requested one until the turn ran.
    """
    return Turn(
        turn_id=record.turn_id,
        session_id=record.session_id,
        batch_id=record.batch_id,
        status=record.status,
        mode=record.mode if record.mode is not None else record.requested_mode,
        mode_changes=[ModeChange.model_validate(change) for change in record.mode_changes],
        output_text=record.output_text,
        pending_tool_calls=[PendingToolCall.model_validate(call) for call in record.pending_tool_calls],
        error=None if record.error is None else ErrorInfo.model_validate(record.error),
        usage=Usage.model_validate(record.usage),
        created_at=record.created_at,
        completed_at=record.completed_at,
    )
