"""The API view of a turn (the ``Turn`` wire model): from a recorded turn, or from the state a worker commits.

``GET /v1/turns/{id}`` answers with :func:`to_turn` of the turn's record; the final events of the turn's
event log carry :func:`committed_turn` of the state the commit point wrote, which is the same JSON
(tests compare the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.db.records import TurnRecord
from shared.models.turn import ModeChange, PendingToolCall, Turn, Usage
from shared.result import ErrorInfo
from shared.state.turn_state import TurnState

__all__ = ["committed_turn", "to_turn", "turn_json"]


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


def committed_turn(state: TurnState, *, created_at: datetime, committed_at: datetime) -> Turn:
    """The API view of a turn just after its commit point wrote ``state`` (``TurnRepository.commit``).

    Args:
        state: the state whose outcome was committed.
        created_at: when the gateway accepted the turn (the record's).
        committed_at: the ``now`` of that commit: a terminal turn's ``completed_at``.

    Returns:
        What :func:`to_turn` of the record makes once that commit is read back.
    """
    return Turn(
        turn_id=state.turn_id,
        session_id=state.session_id,
        batch_id=state.batch_id,
        status=state.status,
        mode=state.mode if state.mode is not None else state.requested_mode,
        mode_changes=[change.model_copy() for change in state.mode_changes],
        output_text=state.output_text,
        pending_tool_calls=[call.model_copy() for call in state.pending_tool_calls],
        error=None if state.error is None else state.error.model_copy(),
        usage=state.usage.model_copy(),
        created_at=created_at,
        completed_at=committed_at if state.status.is_terminal else None,
    )


def turn_json(turn: Turn) -> dict[str, Any]:
    """A turn as the HTTP API and the turn events write it (JSON, ``mode_changes`` by alias)."""
    return turn.model_dump(mode="json", by_alias=True)
