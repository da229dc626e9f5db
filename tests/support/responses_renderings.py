"""Renderings of one response at every stage of its round, through ``render_response``: what the OpenAI
stream tests build their streams from."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from api_gateway.openai.view import render_response
from shared.db.records import TurnRecord
from shared.db.responses import ResponseRecord
from shared.models.turn import TurnStatus
from shared.openai import conversation_id, response_id

__all__ = ["CALLS", "SESSION", "START", "TEXT", "TURN", "completed", "incomplete", "recorded", "rendered", "turn"]

TURN = "turn_" + "1" * 32
SESSION = "sess_" + "2" * 32
START = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
TEXT = "The capital of PotatoLand is **Potato City**.\n\nIt has  two spaces, a tab\tand — unicode: 日本語, ñ, 🥔👩‍👩‍👧!"
"""An answer with every kind of blank and some characters outside ASCII."""
CALLS = [
    {"call_id": "call_weather", "name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'},
    {"call_id": "call_time", "name": "get_time", "arguments": '{"tz":"Europe/Zurich"}'},
]


def turn(status: TurnStatus, **changes: Any) -> TurnRecord:
    """Round 0 of a turn, standing at ``status``."""
    ended = status in (TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED)
    record = TurnRecord(
        turn_id=TURN, session_id=SESSION, org_id="org-a", user_id="user-a", new_session=True,
        requested_mode=None, request={"input": "hi"}, request_hash="h", status=status,
        mode="general" if status is not TurnStatus.QUEUED else None, output_text=None, pending_tool_calls=[],
        mode_changes=[], error=None, usage={"llm_calls": 1, "input_tokens": 12, "output_tokens": 7}, trace=[],
        round=0, client_tool_results=None, paused_rounds=[], deadline_at=None, redrives=0, created_at=START,
        updated_at=START + timedelta(seconds=3), completed_at=START + timedelta(seconds=3) if ended else None,
    )  # fmt: skip
    return replace(record, **changes)


def recorded(*, background: bool = False) -> ResponseRecord:
    """The response that is round 0 of :data:`TURN`, with the request fields a Response echoes."""
    params = {
        "model": "aptix-default", "instructions": "Be brief.", "tools": [
            {"type": "function", "name": "get_weather", "description": None, "strict": True,
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": "auto", "parallel_tool_calls": True, "metadata": {"k": "v"}, "background": background,
        "store": True, "temperature": None, "top_p": None, "max_output_tokens": None,
    }  # fmt: skip
    return ResponseRecord(
        response_id=response_id(TURN, 0), turn_id=TURN, round=0, org_id="org-a", previous_response_id=None,
        conversation_id=conversation_id(SESSION), params=params, input_items=[], idempotency_key=None,
        request_hash="h", created_at=START,
    )  # fmt: skip


def rendered(status: TurnStatus, *, background: bool = False, **changes: Any) -> dict[str, Any]:
    """The response as ``render_response`` renders it with its turn at ``status``."""
    return render_response(turn(status, **changes), recorded(background=background))


def completed(text: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A finished response: its text and, when given, the client tool calls its round paused for."""
    if calls:
        return rendered(TurnStatus.REQUIRES_CLIENT_TOOLS, output_text=text, pending_tool_calls=calls)
    return rendered(TurnStatus.COMPLETED, output_text=text)


def incomplete(text: str) -> dict[str, Any]:
    """A response cut short by its token limit (``render_response`` renders none yet; OpenAI sends them)."""
    return {**completed(text), "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
