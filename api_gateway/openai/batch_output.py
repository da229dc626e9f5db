"""A batch's output and error files, rendered from its turns once it ended (``batch_files`` writes them).

Every request of a batch of the OpenAI face is a turn whose extras carry its line's ``custom_id`` and
the fields its ``Response`` echoes. Once the batch ended, each turn is in exactly one of two files:

- the output file, when its response (round 0 of the turn) is ``completed``, which includes a turn
  that paused for client tools (its output ends in ``function_call`` items):
  ``{"id", "custom_id", "response": {"status_code": 200, "request_id", "body": <Response>}, "error": null}``;
- the error file otherwise: a failed turn as ``{"response": {"status_code", "request_id", "body":
  {"error": {...}}}, "error": null}``; a cancelled one as ``{"response": null, "error": {"code", "message"}}``,
  the code saying by what: ``batch_cancelled`` (the batch's cancel), ``batch_expired`` (its window ran
  out) or ``cancelled`` (the request alone, by ``DELETE /v1/turns/{turn_id}`` or the cancel of its
  response, before its batch was cancelled or expired).

The caller (``batch_files``) reads the turns in request order, 500 at a time, and writes each line to its
file: memory stays bounded whatever the batch's size.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from api_gateway.openai.errors import openai_error_body
from api_gateway.openai.view import render_response
from shared.db.records import TurnRecord
from shared.db.responses import ResponseRecord
from shared.models.turn import TurnStatus
from shared.openai import TurnExtras, response_id

__all__ = ["Part", "line_part", "render_line"]

Part = Literal["output", "error"]
"""Which file of a batch: its output file or its error file."""

_STATUS_CODES = {"llm_rate_limited": 429, "continuation_mismatch": 400, "client_tool_timeout": 408}
"""The status code an error line gives a failed turn's error code (500 otherwise)."""


def line_part(turn: TurnRecord) -> Part | None:
    """The file a request's line goes to; None while its turn is queued or running."""
    status = TurnStatus(turn.status)
    if status.is_in_flight:
        return None
    if status in (TurnStatus.COMPLETED, TurnStatus.REQUIRES_CLIENT_TOOLS) or turn.round > 0:
        return "output"
    return "error"


def render_line(turn: TurnRecord, *, expired: bool, cancelled_at: datetime | None) -> tuple[Part, bytes] | None:
    """A request's line and the file it goes to; None while its turn is queued or running.

    Args:
        turn: one of the batch's turns.
        expired: whether the batch expired (the requests it cancelled are ``batch_expired``, else ``batch_cancelled``).
        cancelled_at: when the batch was cancelled (its expiry cancels it too), None if it was not: a request
            cancelled before that was cancelled on its own (``cancelled``).

    Returns:
        The file and one JSON line (with its line break).
    """
    part = line_part(turn)
    if part is None:
        return None
    line = _output_line(turn) if part == "output" else _error_line(turn, expired=expired, cancelled_at=cancelled_at)
    return part, json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _output_line(turn: TurnRecord) -> dict[str, Any]:
    extras = TurnExtras.of(turn.request)
    record = ResponseRecord(
        response_id=response_id(turn.turn_id, 0), turn_id=turn.turn_id, round=0, org_id=turn.org_id,
        previous_response_id=None, conversation_id=None, params=dict(extras.echo or {}),
        input_items=extras.input_items or [], idempotency_key=None, request_hash="", created_at=turn.created_at,
    )  # fmt: skip
    return {
        "id": _line_id(turn),
        "custom_id": extras.custom_id,
        "response": {"status_code": 200, "request_id": _request_id(turn), "body": render_response(turn, record)},
        "error": None,
    }


def _error_line(turn: TurnRecord, *, expired: bool, cancelled_at: datetime | None) -> dict[str, Any]:
    custom_id = TurnExtras.of(turn.request).custom_id
    if TurnStatus(turn.status) is TurnStatus.CANCELLED:
        ended = turn.completed_at or turn.updated_at
        if cancelled_at is None or ended < cancelled_at:
            error = {"code": "cancelled", "message": "This request was cancelled on its own, before its batch ended."}
        elif expired:
            error = {"code": "batch_expired",
                     "message": "This request could not be executed before the completion window expired."}  # fmt: skip
        else:
            error = {"code": "batch_cancelled", "message": "This request was cancelled with its batch."}
        return {"id": _line_id(turn), "custom_id": custom_id, "response": None, "error": error}
    code = str((turn.error or {}).get("code") or "internal_error")
    message = str((turn.error or {}).get("message") or "the request failed")
    status = _STATUS_CODES.get(code, 500)
    body = openai_error_body(status, code, message)
    return {
        "id": _line_id(turn),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": _request_id(turn), "body": body},
        "error": None,
    }


def _line_id(turn: TurnRecord) -> str:
    return f"batch_req_{turn.turn_id.removeprefix('turn_')}"


def _request_id(turn: TurnRecord) -> str:
    return f"req_{turn.turn_id.removeprefix('turn_')}"
