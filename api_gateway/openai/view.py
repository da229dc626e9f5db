"""A turn's round seen through OpenAI's ``Response`` type.

A response is one round of a turn (``shared.openai.ids``): round 0 from the turn's start to its
first pause or end, then one round per tool-results re-entry. Its status and output come from the
turn (the round as it stands, or, once the turn moved on, the round as it stood at its pause:
``TurnRecord.paused_rounds``); what its request said comes from its ``ResponseRecord``.

A round that paused for client tools is a ``completed`` response whose output ends with its
``function_call`` items, as OpenAI answers. Aptix's own facts go in one extension object,
``aptix`` (the SDK's models keep extra fields).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.db.records import TurnRecord
from shared.db.responses import ResponseRecord
from shared.models.turn import TurnStatus
from shared.openai import session_of_conversation

__all__ = ["TERMINAL_STATUSES", "render_response", "response_status"]

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "incomplete"})
"""A response in one of these no longer changes."""
_STATUS = {
    TurnStatus.QUEUED: "queued",
    TurnStatus.RUNNING: "in_progress",
    TurnStatus.REQUIRES_CLIENT_TOOLS: "completed",
    TurnStatus.COMPLETED: "completed",
    TurnStatus.FAILED: "failed",
    TurnStatus.CANCELLED: "cancelled",
}
_ERROR_CODES = {"llm_rate_limited": "rate_limit_exceeded"}
"""OpenAI's ``ResponseError.code`` is a closed set: ours map onto it (``server_error`` otherwise); our own
code stays in the error's ``type`` and in ``aptix.error_code``."""


def response_status(turn: TurnRecord, round_: int) -> str:
    """The status of the response that is round ``round_`` of ``turn``."""
    if round_ < turn.round:
        return "completed"
    if round_ > turn.round:
        return "queued"
    return _STATUS[TurnStatus(turn.status)]


def render_response(turn: TurnRecord, response: ResponseRecord) -> dict[str, Any]:
    """The ``Response`` JSON of ``response`` as ``turn`` now stands.

    Args:
        turn: the turn whose round the response is.
        response: the response's record.

    Returns:
        A dict that validates as the ``openai`` package's ``Response``.
    """
    status = response_status(turn, response.round)
    round_ = _round_outcome(turn, response.round)
    suffix = response.response_id.removeprefix("resp_")
    output: list[dict[str, Any]] = []
    if status == "completed":
        if round_["output_text"]:
            output.append(_message(round_["output_text"], f"msg_{suffix}"))
        output += [_function_call(call) for call in round_["pending_tool_calls"]]
    error = None
    if status == "failed" and turn.error is not None:
        code = str(turn.error.get("code"))
        error = {"code": _ERROR_CODES.get(code, "server_error"), "message": str(turn.error.get("message")),
                 "type": code}  # fmt: skip
    conversation = response.conversation_id
    params = response.params
    return {
        "id": response.response_id,
        "object": "response",
        "created_at": int(response.created_at.timestamp()),
        "status": status,
        "completed_at": _completed_at(round_, status),
        "error": error,
        "incomplete_details": None,
        "model": params.get("model"),
        "output": output,
        "usage": _usage(turn, response.round) if status in TERMINAL_STATUSES else None,
        "previous_response_id": response.previous_response_id,
        "conversation": None if conversation is None else {"id": conversation},
        **{name: value for name, value in params.items() if name != "model"},
        "aptix": {
            "turn_id": turn.turn_id,
            "session_id": turn.session_id,
            "round": response.round,
            "turn_status": round_["status"],
            "mode": round_["mode"],
            "mode_changes": round_["mode_changes"],
            "error_code": None if turn.error is None or status != "failed" else turn.error.get("code"),
        },
    }


def conversation_session(response: ResponseRecord) -> str | None:
    """The session id of the conversation the response's request named, if any."""
    return None if response.conversation_id is None else session_of_conversation(response.conversation_id)


def _round_outcome(turn: TurnRecord, round_: int) -> dict[str, Any]:
    """The round as it ended (a paused round the turn moved on from) or as it stands (the turn's current one)."""
    if round_ < turn.round:
        for paused in turn.paused_rounds:
            if paused.get("round") == round_:
                return {"status": TurnStatus.REQUIRES_CLIENT_TOOLS.value, **paused}
    return {
        "status": turn.status.value, "at": (turn.completed_at or turn.updated_at).isoformat(),
        "output_text": turn.output_text, "pending_tool_calls": turn.pending_tool_calls, "usage": turn.usage,
        "mode": turn.mode if turn.mode is not None else turn.requested_mode, "mode_changes": turn.mode_changes,
    }  # fmt: skip


def _usage(turn: TurnRecord, round_: int) -> dict[str, Any]:
    """The tokens of this round: the turn's totals at its end, less those at the end of the round before."""
    until = _round_outcome(turn, round_)["usage"] or {}
    before: dict[str, Any] = {}
    for paused in turn.paused_rounds:
        if paused.get("round") == round_ - 1:
            before = paused.get("usage") or {}
    input_tokens = max(0, int(until.get("input_tokens", 0)) - int(before.get("input_tokens", 0)))
    output_tokens = max(0, int(until.get("output_tokens", 0)) - int(before.get("output_tokens", 0)))
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _completed_at(round_: dict[str, Any], status: str) -> int | None:
    if status not in TERMINAL_STATUSES:
        return None
    return int(datetime.fromisoformat(round_["at"]).timestamp())


def _message(text: str, item_id: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call['call_id']}",
        "call_id": call["call_id"],
        "name": call["name"],
        "arguments": call["arguments"],
        "status": "completed",
    }
