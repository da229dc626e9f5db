"""The OpenAI event stream of a response, as a pure function of the response as it is rendered.

A response's stream is never a relay of the model's live token deltas: a round re-driven after a
worker's death may write other text, and a stream resumed on another gateway
(``GET /openai/v1/responses/{id}?stream=true&starting_after=N``) must continue the first one with no
gap and no repeat. So the stream is derived from the ``Response`` JSON that
``api_gateway.openai.view.render_response`` builds, and from nothing else:

- ``response.created`` (``sequence_number`` 0) and ``response.in_progress`` (1) carry the response
  reduced to what never changes (:func:`opening_response`), so they read the same whenever and
  wherever they are built;
- once the response is terminal (``view.TERMINAL_STATUSES``), each output item in order:
  ``response.output_item.added`` (the item ``in_progress``, its content or arguments empty, as
  OpenAI sends it), then a message's parts (``response.content_part.added``, the text in
  deterministic pieces as ``response.output_text.delta``, ``response.output_text.done``,
  ``response.content_part.done``) or a function call's arguments
  (``response.function_call_arguments.delta`` pieces and ``.done``), then
  ``response.output_item.done`` with the item exactly as the response holds it;
- then one terminal event carrying the whole rendered response (:data:`TERMINAL_EVENTS`).

While the response is not terminal, its stream is the two opening events; once it is, the full
list, whose first two events are those same two.
"""

from __future__ import annotations

import json
import re
from typing import Any

from api_gateway.openai.view import TERMINAL_STATUSES

__all__ = ["MAX_PIECES", "TERMINAL_EVENTS", "opening_response", "pieces", "sse_frame", "stream_events"]

TERMINAL_EVENTS: dict[str, str] = {
    "completed": "response.completed",
    "failed": "response.failed",
    "incomplete": "response.incomplete",
    "cancelled": "response.failed",
}
"""The event that ends the stream of a response in each terminal status.

OpenAI defines no stream event for a cancelled response: the SDK's ``ResponseStreamEvent`` union
(openai 3.54.0) has ``response.completed``, ``response.failed`` and ``response.incomplete`` as
its only terminal events, and OpenAI's own streams of a cancelled background response have been
seen to just carry on (openai/openai-python#2643). A cancelled response is a response that did not
produce its result, so its stream ends with ``response.failed``, carrying the response as it is
rendered (``status: "cancelled"``, ``error: null``): the SDK's types accept it, a client that
treats ``response.failed`` as "no result" is right, and one that reads the status learns why.
(``validate.py`` of the shared fixtures notes that its status is not ``failed``.)"""
MAX_PIECES = 64
"""A text or an argument string is streamed in at most this many deltas."""
_OPENING_AT_START = ("id", "object", "created_at")
_VOLATILE = frozenset({"status", "output", "usage", "error", "completed_at", "incomplete_details", "aptix"})
"""The rendered response's fields that change as the round goes on; the rest echo its request."""
_APTIX_STABLE = ("turn_id", "session_id", "round")
_WORD_END = re.compile(r"(?<=\S)(?=\s)")
_MIN_ARGUMENT_PIECE = 8


def stream_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream of ``response`` as far as it exists: the opening events, and the rest once it is terminal.

    Args:
        response: the response as ``render_response`` renders it now.

    Returns:
        The events' data, each with its ``type`` and ``sequence_number`` (0, 1, 2, ... over the whole
        list). The same response gives the same list, and a later rendering's list starts with an
        earlier one's.
    """
    background = response.get("background") is True
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening_response(response, queued=background)},
        {"type": "response.in_progress", "response": opening_response(response, queued=False)},
    ]
    status = response.get("status")
    if status in TERMINAL_STATUSES:
        for index, item in enumerate(response.get("output") or []):
            events += _item_events(item, index)
        events.append({"type": TERMINAL_EVENTS[str(status)], "response": response})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def opening_response(response: dict[str, Any], *, queued: bool) -> dict[str, Any]:
    """``response`` reduced to the fields that never change, as the opening events carry it.

    Every field of the rendered response is kept except those that move with the round (status,
    output, usage, error, times, details); of the ``aptix`` extension only the turn, session and
    round stay (its mode and statuses move).

    Args:
        response: the response as rendered at any time.
        queued: status ``queued`` (a background response's ``response.created``), else ``in_progress``.

    Returns:
        A ``Response`` JSON with no output, no usage and no error.
    """
    stable = {name: value for name, value in response.items() if name not in _VOLATILE}
    aptix = response.get("aptix")
    opening = {
        **{name: stable.pop(name) for name in _OPENING_AT_START if name in stable},
        "status": "queued" if queued else "in_progress",
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "output": [],
        "usage": None,
        **stable,
    }
    if isinstance(aptix, dict):
        opening["aptix"] = {name: aptix[name] for name in _APTIX_STABLE if name in aptix}
    return opening


def sse_frame(event: dict[str, Any]) -> bytes:
    """One event as a Server-Sent Events frame: ``event: <type>``, ``data: <json>`` and a blank line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def pieces(text: str, *, words: bool = True) -> list[str]:
    """``text`` cut into at most :data:`MAX_PIECES` deltas that join back to it, the same way every time.

    Args:
        text: the text (or argument string).
        words: cut after each word, keeping the blanks before the next one (``"The"``, ``" capital"``),
            with neighbouring words merged to stay under the bound; else cut into equal runs of characters
            (arguments, whose JSON has few blanks).

    Returns:
        The pieces (none for an empty text).
    """
    if not text:
        return []
    if not words:
        size = max(_MIN_ARGUMENT_PIECE, -(-len(text) // MAX_PIECES))
        return [text[start : start + size] for start in range(0, len(text), size)]
    cut = _WORD_END.split(text)
    size = -(-len(cut) // MAX_PIECES)
    return ["".join(cut[start : start + size]) for start in range(0, len(cut), size)]


def _item_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events of output item ``index``, from its ``output_item.added`` to its ``output_item.done``."""
    kind = item.get("type")
    item_id = str(item.get("id", ""))
    at = {"item_id": item_id, "output_index": index}
    if kind == "message":
        added = {**item, "status": "in_progress", "content": []}
        parts = enumerate(item.get("content") or [])
        inner = [event for number, part in parts for event in _part_events(part, at, number)]
    elif kind == "function_call":
        arguments = str(item.get("arguments", ""))
        added = {**item, "status": "in_progress", "arguments": ""}
        inner = [
            *({"type": "response.function_call_arguments.delta", **at, "delta": piece}
              for piece in pieces(arguments, words=False)),
            {"type": "response.function_call_arguments.done", **at, "arguments": arguments},
        ]  # fmt: skip
    else:  # no other kind is rendered today; an item with no deltas of its own is added and done whole
        added, inner = item, []
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        *inner,
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _part_events(part: dict[str, Any], at: dict[str, Any], number: int) -> list[dict[str, Any]]:
    """The events of a message's content part ``number``: added, its deltas and done, then the part done."""
    at = {**at, "content_index": number}
    kind = part.get("type")
    if kind == "output_text":
        text = str(part.get("text", ""))
        empty = {**part, "text": "", "annotations": [], **({"logprobs": []} if "logprobs" in part else {})}
        inner = [
            *({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []} for piece in pieces(text)),
            {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        ]
    elif kind == "refusal":
        refusal = str(part.get("refusal", ""))
        empty = {**part, "refusal": ""}
        inner = [
            *({"type": "response.refusal.delta", **at, "delta": piece} for piece in pieces(refusal)),
            {"type": "response.refusal.done", **at, "refusal": refusal},
        ]
    else:
        empty, inner = part, []
    return [
        {"type": "response.content_part.added", **at, "part": empty},
        *inner,
        {"type": "response.content_part.done", **at, "part": part},
    ]
