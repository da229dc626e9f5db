"""Input items of the OpenAI face: checked and normalised for the model, and shown back with ids.

A request's ``input`` is a string (one user message) or a list of items: messages (roles ``user``,
``assistant``, ``system``, ``developer``; content a string or ``input_text`` / ``output_text``
parts), ``function_call`` and ``function_call_output`` items. Anything else (images, files, audio,
reasoning, item references) is refused, naming the item (``input[2].content[0].type``).

:func:`model_items` gives the items as the model is sent them: an assistant message's text as a
string, another role's as ``input_text`` parts, calls and outputs with their ids. :func:`listed_items`
gives them as ``GET …/input_items`` and conversation items show them (each with an id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api_gateway.openai.errors import invalid

__all__ = ["ROLES", "listed_items", "model_items", "text_of", "user_text"]

ROLES = ("user", "assistant", "system", "developer")
"""The roles a message of the input may have."""
_TEXT_PARTS = ("input_text", "output_text")


def model_items(value: object, *, param: Sequence[str | int] = ("input",)) -> list[dict[str, Any]]:
    """Check ``input`` and normalise it into Responses API input items for the model.

    Args:
        value: the request's ``input`` (a string or a list of items).
        param: where it sits in the body, for the error's ``param``.

    Returns:
        The items, in order.

    Raises:
        InvalidRequest: an item, a content part or a field that the face does not take, naming it.
    """
    if isinstance(value, str):
        if not value.strip():
            raise invalid("input must not be empty", param)
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list) or not value:
        raise invalid("input must be a non-empty string or a non-empty list of items", param)
    return [_item(item, (*param, index)) for index, item in enumerate(value)]


def user_text(items: Sequence[dict[str, Any]]) -> str:
    """The text of the last user message of ``items`` (what the turn records as its input), or ``""``."""
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "user":
            return text_of(item.get("content"))
    return ""


def text_of(content: object) -> str:
    """The text of a message's content: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def listed_items(items: Sequence[dict[str, Any]], *, prefix: str) -> list[dict[str, Any]]:
    """``items`` (as :func:`model_items` made them) as the API lists them, with ids ``<kind>_<prefix>_<n>``.

    Args:
        items: the normalised items.
        prefix: what makes the ids unique (the response's id without ``resp_``).

    Returns:
        One ``ResponseItem``-shaped dict per item.
    """
    listed: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            text = text_of(item["content"])
            if item["role"] == "assistant":
                listed.append({"id": f"msg_{prefix}_{index}", "type": "message", "role": "assistant",
                               "status": "completed",
                               "content": [{"type": "output_text", "text": text, "annotations": []}]})  # fmt: skip
            else:
                listed.append({"id": f"msg_{prefix}_{index}", "type": "message", "role": item["role"],
                               "status": "completed", "content": [{"type": "input_text", "text": text}]})  # fmt: skip
        elif kind == "function_call":
            listed.append({"id": item.get("id") or f"fc_{prefix}_{index}", "type": "function_call",
                           "call_id": item["call_id"], "name": item["name"], "arguments": item["arguments"],
                           "status": "completed"})  # fmt: skip
        else:
            listed.append({"id": f"fco_{prefix}_{index}", "type": "function_call_output",
                           "call_id": item["call_id"], "output": item["output"], "status": "completed"})  # fmt: skip
    return listed


def _item(item: object, param: tuple[str | int, ...]) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid("each input item must be an object", param)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _message(item, param)
    if kind == "function_call":
        _strings(item, ("call_id", "name", "arguments"), param)
        call = {"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                "arguments": item["arguments"]}  # fmt: skip
        if isinstance(item.get("id"), str) and item["id"]:
            call["id"] = item["id"]
        return call
    if kind == "function_call_output":
        _strings(item, ("call_id",), param)
        return {"type": "function_call_output", "call_id": item["call_id"], "output": _output(item, param)}
    raise invalid(
        f"input item type {kind!r} is not supported here: messages, function_call and function_call_output only",
        (*param, "type"),
    )


def _message(item: dict[str, Any], param: tuple[str | int, ...]) -> dict[str, Any]:
    role = item.get("role")
    if role not in ROLES:
        raise invalid(f"message role must be one of {', '.join(ROLES)}", (*param, "role"))
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _TEXT_PARTS:
                raise invalid(
                    f"content part type {kind!r} is not supported here: input_text and output_text only",
                    (*param, "content", index, "type"),
                )
            if not isinstance(part.get("text"), str):
                raise invalid("a text part needs its text", (*param, "content", index, "text"))
        text = text_of(content)
    else:
        raise invalid("message content must be a string or a list of text parts", (*param, "content"))
    if role == "assistant":
        return {"type": "message", "role": "assistant", "content": text}
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def _output(item: dict[str, Any], param: tuple[str | int, ...]) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(part, dict) and part.get("type") == "input_text" for part in output):
        return text_of(output)
    raise invalid("a function_call_output's output must be a string (or input_text parts)", (*param, "output"))


def _strings(item: dict[str, Any], names: tuple[str, ...], param: tuple[str | int, ...]) -> None:
    for name in names:
        if not isinstance(item.get(name), str) or not item[name]:
            raise invalid(f"{item.get('type')} items need {name} as a non-empty string", (*param, name))
