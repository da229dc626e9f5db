"""The script of the scripted model: how one Responses API request body becomes one answer.

Behaviour depends only on the request (its directives: :mod:`scripted_llm.directives`), except the
``:N`` counts of ``[[fail]]``, ``[[cut]]`` and ``[[midfail]]``, which are kept per directive and
exact last user text.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from scripted_llm.directives import Directives, ScriptError, parse_directives
from scripted_llm.streaming import failed_events, failed_response, stream_events

__all__ = [
    "Directives",
    "ScriptError",
    "ScriptState",
    "ScriptedAnswer",
    "error_body",
    "last_user_text",
    "parse_directives",
]

LOOP_FUNCTION = "get_current_time"


@dataclass(frozen=True, slots=True)
class ScriptedAnswer:
    """What the server sends back for one request."""

    status_code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Extra latency this request asked for (``[[sleep:MS]]``)."""
    events: list[dict[str, Any]] | None = None
    """The stream events to send instead of ``body`` (a request with ``"stream": true``)."""
    event_delay_s: float = 0.0
    """The pause between two stream events (``[[drip:MS]]``)."""
    cut: bool = False
    """End the connection after ``events`` without ending the stream properly (``[[cut:N]]``)."""


class ScriptState:
    """The per-server state of the script: the ``:N`` counters of ``[[fail]]``, ``[[cut]]`` and ``[[midfail]]``."""

    def __init__(self) -> None:
        self._fail_counts: Counter[tuple[str, str]] = Counter()

    def answer(self, body: object, *, seq: int) -> ScriptedAnswer:
        """Decide the answer to one request body.

        Args:
            body: the decoded JSON request body.
            seq: the request's sequence number, used for deterministic ids.

        Returns:
            The status code, body, headers and extra delay to answer with.
        """
        try:
            request = _checked_request(body)
            text = last_user_text(request["input"])
            directives = parse_directives(text)
        except ScriptError as exc:
            return ScriptedAnswer(400, error_body(400, str(exc)))
        delay_s = directives.sleep_ms / 1000.0
        if directives.fail_status is not None and self._applies("fail", text, directives.fail_times):
            return _failure(directives.fail_status, delay_s, retry_after=directives.retry_after)
        response = _response(request, text, directives, seq=seq)
        midfail = directives.midfail_code is not None and self._applies("midfail", text, directives.midfail_times)
        if request.get("stream") is not True:
            if midfail:
                response = failed_response(response, code=str(directives.midfail_code), message="scripted failure")
            return ScriptedAnswer(200, response, delay_s=delay_s)
        if midfail:
            events = failed_events(response, code=str(directives.midfail_code), message="scripted failure")
        else:
            events = stream_events(response)
        cut = directives.cut_after is not None and self._applies("cut", text, directives.cut_times)
        if cut:
            events = events[: directives.cut_after]
        return ScriptedAnswer(
            200, response, delay_s=delay_s, events=events, event_delay_s=directives.drip_ms / 1000.0, cut=cut
        )

    def _applies(self, directive: str, text: str, times: int | None) -> bool:
        """Whether a directive with a ``:TIMES`` count still applies to this request (always without one)."""
        if times is None:
            return True
        self._fail_counts[directive, text] += 1
        return self._fail_counts[directive, text] <= times


def last_user_text(input_value: object) -> str:
    """The text of the last ``user`` message of a request's ``input`` ("" when there is none).

    Args:
        input_value: the request's ``input``: a string or a list of input items.

    Returns:
        The text, with the ``input_text`` parts of a list content joined.
    """
    if isinstance(input_value, str):
        return input_value
    if not isinstance(input_value, list):
        return ""
    index = _last_user_index(input_value)
    return "" if index is None else _content_text(input_value[index].get("content"))


def error_body(status_code: int, message: str) -> dict[str, Any]:
    """The OpenAI error envelope for a status code.

    Args:
        status_code: the HTTP status the error is sent with.
        message: the error message.

    Returns:
        ``{"error": {"message", "type", "param", "code"}}``.
    """
    if status_code == 429:
        error_type, code = "requests", "rate_limit_exceeded"
    elif status_code >= 500:
        error_type, code = "server_error", "server_error"
    else:
        error_type, code = "invalid_request_error", None
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def _checked_request(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ScriptError("request body must be a JSON object")
    if not body.get("model"):
        raise ScriptError("Missing required parameter: 'model'.")
    if "input" not in body or not isinstance(body["input"], (str, list)):
        raise ScriptError("Missing required parameter: 'input' (a string or a list of items).")
    return body


def _failure(status_code: int, delay_s: float, *, retry_after: str = "0") -> ScriptedAnswer:
    headers = {"retry-after": retry_after} if status_code == 429 else {}
    return ScriptedAnswer(status_code, error_body(status_code, "scripted failure"), headers, delay_s)


def _last_user_index(items: list[Any]) -> int | None:
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message":
            return index
    return None


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _output_text(value: object) -> str:
    return value if isinstance(value, str) else _content_text(value) or json.dumps(value)


def _tool_outputs_after_user(items: object) -> list[tuple[str, str]]:
    """(function name, output) of the ``function_call_output`` items after the last user message."""
    if not isinstance(items, list):
        return []
    names: dict[object, object] = {
        item.get("call_id"): item.get("name")
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call"
    }
    start = _last_user_index(items)
    return [
        (str(names.get(item.get("call_id"), item.get("call_id"))), _output_text(item.get("output")))
        for item in items[(start if start is not None else -1) + 1 :]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


def _response(request: dict[str, Any], text: str, directives: Directives, *, seq: int) -> dict[str, Any]:
    """A complete Responses API response object for a request that does not fail."""
    outputs = _tool_outputs_after_user(request["input"])
    calls: tuple[tuple[str, str], ...] = ()
    if directives.loop:
        calls = ((LOOP_FUNCTION, "{}"),)
    elif directives.calls and not outputs:
        calls = directives.calls
    output: list[dict[str, Any]]
    if calls:
        output = [
            {
                "type": "function_call",
                "id": f"fc_{seq:012x}{index:04x}",
                "call_id": f"call_{seq:012x}{index:04x}",
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
            for index, (name, arguments) in enumerate(calls)
        ]
        output_words = sum(_words(arguments) for _, arguments in calls)
    else:
        if directives.calls:
            answer = "Tool results: " + "; ".join(f"{name}={value}" for name, value in outputs)
        elif directives.say is not None:
            answer = directives.say
        else:
            answer = f"Echo: {text}"
        output = [
            {
                "type": "message",
                "id": f"msg_{seq:016x}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        ]
        output_words = _words(answer)
    input_words = _input_words(request)
    return {
        "id": f"resp_{seq:016x}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "metadata": {},
        "model": request["model"],
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": request.get("tools") or [],
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": input_words,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_words,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_words + output_words,
        },
    }


def _input_words(request: dict[str, Any]) -> int:
    """Whitespace-separated words of the instructions and of every input text."""
    count = _words(request.get("instructions"))
    items = request["input"]
    if isinstance(items, str):
        return count + _words(items)
    for item in items:
        if not isinstance(item, dict):
            continue
        if "content" in item:
            count += _words(_content_text(item["content"]))
        elif item.get("type") == "function_call_output":
            count += _words(_output_text(item.get("output")))
        elif item.get("type") == "function_call":
            count += _words(item.get("arguments"))
    return count


def _words(text: object) -> int:
    return len(text.split()) if isinstance(text, str) else 0
