"""The scripted model's streaming mode: a complete response replayed as Responses API stream events.

A request with ``"stream": true`` gets ``text/event-stream``: ``response.created``,
``response.in_progress``, then per output item ``response.output_item.added``, its content events
(``content_part.added``, ``output_text.delta`` xN, ``output_text.done``, ``content_part.done`` for a
message; ``function_call_arguments.delta`` xN and ``.done`` for a function call) and
``response.output_item.done``, and last ``response.completed`` carrying exactly the body the same
request gets without streaming. Every event has ``sequence_number`` 0, 1, 2, ...; the shapes are
copied from recorded OpenAI streams (the real-traffic fixtures' ``live_stream_*.sse``), without
their ``obfuscation`` padding.

Two directives break a stream on purpose (see :mod:`scripted_llm.script`): ``[[cut:N]]`` ends the
connection after N events without a terminal event, ``[[midfail:CODE]]`` sends the answer's first
output item and then an ``error`` event and ``response.failed`` (without streaming: a 200 whose status is
``failed``, as the API does).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["SSE_MEDIA_TYPE", "encode_event", "failed_events", "failed_response", "stream_events"]

SSE_MEDIA_TYPE = "text/event-stream; charset=utf-8"
"""The content type of a streamed answer (the API's, as recorded)."""

_PIECE = re.compile(r"\s*\S{1,8}|\s+", re.DOTALL)
"""A delta: a word with the whitespace before it, long words split every 8 characters (real deltas
are tokens: ``"The"``, ``" capital"``, ``"{\\""``)."""


def stream_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream events that deliver ``response``, numbered from 0.

    Args:
        response: a complete, successful Responses API response (``status: "completed"``).

    Returns:
        The events' data objects, in order; the last is ``response.completed`` with ``response``.
    """
    events = _opening(response)
    for index, item in enumerate(response["output"]):
        events.extend(_item_events(item, index))
    events.append({"type": "response.completed", "response": response})
    return _numbered(events)


def failed_response(response: dict[str, Any], *, code: str, message: str) -> dict[str, Any]:
    """``response`` as the API reports a generation that failed after its first output item:
    ``status: "failed"``, an ``error``, only that item in ``output`` and no usage.

    Args:
        response: the response the request would have had.
        code: the ``error.code`` (e.g. ``server_error``).
        message: the ``error.message``.

    Returns:
        A new response body; ``response`` is unchanged.
    """
    error = {"code": code, "message": message}
    return {**response, "status": "failed", "error": error, "output": response["output"][:1], "usage": None}


def failed_events(response: dict[str, Any], *, code: str, message: str) -> list[dict[str, Any]]:
    """A stream that delivers the first output item of ``response`` and then fails.

    Args:
        response: the response the request would have had.
        code: the error code of the ``error`` event and of the failed response.
        message: the error message.

    Returns:
        The events, numbered: the opening, every event of the first item (its deltas included), an
        ``error`` event (``code``/``message``/``param`` at its top level, as the SDK's
        ``ResponseErrorEvent`` reads it) and ``response.failed``. The first item is finished before
        the failure, so the stream stays valid (``validate.py`` refuses deltas left without their
        ``.done``); its deltas have been sent all the same.
    """
    events = _opening(response)
    if response["output"]:
        events.extend(_item_events(response["output"][0], 0))
    events.append({"type": "error", "code": code, "message": message, "param": None})
    events.append({"type": "response.failed", "response": failed_response(response, code=code, message=message)})
    return _numbered(events)


def encode_event(event: dict[str, Any]) -> bytes:
    """One event as server-sent-event bytes: ``event: TYPE``, ``data: JSON`` and a blank line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _opening(response: dict[str, Any]) -> list[dict[str, Any]]:
    started = {**response, "status": "in_progress", "output": [], "usage": None, "error": None}
    return [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": copy.deepcopy(started)},
    ]


def _item_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    kind = item.get("type")
    if kind == "message":
        return _message_events(item, index)
    if kind == "function_call":
        return _function_call_events(item, index)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _message_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**item, "status": "in_progress", "content": []}},
    ]  # fmt: skip
    for content_index, part in enumerate(item["content"]):
        text = part.get("text", "")
        at = {**where, "content_index": content_index}
        events.append({"type": "response.content_part.added", **at, "part": {**part, "text": "", "logprobs": []}})
        events.extend(
            {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []} for piece in _pieces(text)
        )
        events.append({"type": "response.output_text.done", **at, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", **at, "part": {**part, "logprobs": []}})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def _function_call_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    arguments = item["arguments"]
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**item, "status": "in_progress", "arguments": ""}},
        *({"type": "response.function_call_arguments.delta", **where, "delta": piece} for piece in _pieces(arguments)),
        {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]  # fmt: skip


def _pieces(text: str) -> Iterator[str]:
    return (match.group(0) for match in _PIECE.finditer(text))


def _numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]
