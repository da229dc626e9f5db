"""``POST /openai/v1/responses``: OpenAI's create request, checked field by field into a :class:`ResponseCreate`.

Every field of OpenAI's create request is either taken (mapped onto the turn), passed on to the
model's call (:data:`MODEL_OPTIONS`), or accepted and ignored (:data:`IGNORED`); a field that is not
OpenAI's is a 400 naming it, except the Aptix extensions ``mode`` and ``webhook_url`` (which the SDK
sends through ``extra_body``). Errors name the field as OpenAI's ``param`` does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from api_gateway.openai.errors import invalid
from api_gateway.openai.items import model_items
from shared.models.turn import check_json_strings

__all__ = ["IGNORED", "MODEL_OPTIONS", "ResponseCreate", "check_metadata", "parse_create"]

MODEL_OPTIONS = (
    "temperature", "top_p", "max_output_tokens", "tool_choice", "parallel_tool_calls", "text", "reasoning",
    "truncation", "top_logprobs", "service_tier", "prompt_cache_key", "prompt_cache_retention", "max_tool_calls",
    "include", "user", "safety_identifier",
)  # fmt: skip
"""Fields copied into each model request of the turn as given (they mean something to the model)."""
IGNORED = (
    "stream_options", "background_options", "context_management", "prompt", "prompt_cache_options",
    "access_programs", "image", "moderation",
)  # fmt: skip
"""Fields of OpenAI's request that are accepted and ignored (a real client may send them by default)."""
_TAKEN = (
    "input", "model", "instructions", "tools", "metadata", "previous_response_id", "conversation", "store",
    "background", "stream",
)  # fmt: skip
_EXTENSIONS = ("mode", "webhook_url")
_KNOWN = frozenset((*MODEL_OPTIONS, *IGNORED, *_TAKEN, *_EXTENSIONS))
_TOOL_CHOICES = ("none", "auto", "required")
_ECHO_DEFAULTS: dict[str, Any] = {
    "tool_choice": "auto", "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
    "max_output_tokens": None, "text": {"format": {"type": "text"}}, "truncation": "disabled",
}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreate:
    """A checked create request."""

    input_items: list[dict[str, Any]]
    """The input as items for the model (``api_gateway.openai.items``)."""
    input_is_text: bool
    """``input`` was a string (one user message)."""
    model: str | None
    instructions: str | None
    tools: list[dict[str, Any]]
    """Function tools, as ``ClientTool`` takes them."""
    metadata: dict[str, str]
    previous_response_id: str | None
    conversation: str | None
    store: bool
    background: bool
    stream: bool
    mode: str | None
    webhook_url: str | None
    model_options: dict[str, Any]
    """The :data:`MODEL_OPTIONS` the request gave."""
    request_hash: str
    """Of the whole body: tells a repeated ``Idempotency-Key`` with the same body from another."""

    def echoed(self, model: str) -> dict[str, Any]:
        """The request's fields a ``Response`` echoes (defaults where the request gave none).

        Args:
            model: the model the turn runs with (the request's, or the deployment's default).
        """
        echoed = {**_ECHO_DEFAULTS, **self.model_options}
        return {
            **echoed,
            "model": model,
            "instructions": self.instructions,
            "tools": [dict(tool) for tool in self.tools],
            "metadata": self.metadata,
            "background": self.background,
            "store": self.store,
        }


def parse_create(body: object) -> ResponseCreate:
    """Check a create request's body.

    Args:
        body: the decoded JSON body.

    Returns:
        The checked request.

    Raises:
        InvalidRequest: a field that is not OpenAI's, or a value OpenAI would refuse (400 naming it).
    """
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", ())
    try:
        check_json_strings(body)
    except ValueError as exc:
        raise invalid(f"the request body is not acceptable: {exc}", ()) from exc
    for name in body:
        if name not in _KNOWN:
            raise invalid(f"Unknown parameter: {name!r}.", (name,), code="unknown_parameter")
    if "input" not in body:
        raise invalid("Missing required parameter: 'input'.", ("input",), code="missing_required_parameter")
    store = _bool(body, "store", default=True)
    background = _bool(body, "background", default=False)
    if background and not store:
        raise invalid("Background responses require store=true (Aptix always keeps what it runs).", ("store",))
    previous = _string(body, "previous_response_id")
    conversation = _conversation(body.get("conversation"))
    if previous is not None and conversation is not None:
        raise invalid(
            "previous_response_id and conversation cannot both be given.", ("previous_response_id",),
        )  # fmt: skip
    options = {name: body[name] for name in MODEL_OPTIONS if body.get(name) is not None}
    _check_options(options)
    return ResponseCreate(
        input_items=model_items(body["input"]),
        input_is_text=isinstance(body["input"], str),
        model=_string(body, "model"),
        instructions=_string(body, "instructions", empty_ok=True),
        tools=_tools(body.get("tools")),
        metadata=check_metadata(body.get("metadata")),
        previous_response_id=previous,
        conversation=conversation,
        store=store,
        background=background,
        stream=_bool(body, "stream", default=False),
        mode=_string(body, "mode"),
        webhook_url=_string(body, "webhook_url"),
        model_options=options,
        request_hash=hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
    )


def _bool(body: dict[str, Any], name: str, *, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", (name,))
    return value


def _string(body: dict[str, Any], name: str, *, empty_ok: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or (not value and not empty_ok):
        raise invalid(f"{name} must be a non-empty string", (name,))
    return value or None


def _conversation(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
    if not isinstance(value, str) or not value:
        raise invalid('conversation must be a conversation id or {"id": ...}', ("conversation",))
    return value


def _tools(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools must be a list", ("tools",))
    tools = []
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise invalid(
                f"tool type {kind!r} is not supported: Aptix has no hosted tools; function tools only "
                "(server tools come from the mode catalog)",
                ("tools", index, "type"),
            )
        assert isinstance(tool, dict)
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("a function tool needs a name", ("tools", index, "name"))
        parameters = tool.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise invalid("parameters must be a JSON Schema object", ("tools", index, "parameters"))
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid("description must be a string", ("tools", index, "description"))
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid("strict must be a boolean", ("tools", index, "strict"))
        tools.append({"type": "function", "name": name, "description": description, "parameters": parameters,
                      "strict": bool(strict)})  # fmt: skip
    return tools


def check_metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 16:
        raise invalid("metadata must be an object of at most 16 string values", ("metadata",))
    for key, item in value.items():
        if not isinstance(item, str) or len(key) > 64 or len(item) > 512:
            message = "metadata keys are at most 64 characters and values strings of at most 512"
            raise invalid(message, ("metadata", key))
    return dict(value)


def _check_options(options: dict[str, Any]) -> None:
    for name in ("temperature", "top_p"):
        if name in options:
            value = options[name]
            top = 2.0 if name == "temperature" else 1.0
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= top:
                raise invalid(f"{name} must be a number from 0 to {top:g}", (name,))
    for name in ("max_output_tokens", "top_logprobs", "max_tool_calls"):
        if name in options:
            value = options[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid(f"{name} must be a non-negative integer", (name,))
    if "parallel_tool_calls" in options and not isinstance(options["parallel_tool_calls"], bool):
        raise invalid("parallel_tool_calls must be a boolean", ("parallel_tool_calls",))
    choice = options.get("tool_choice")
    if choice is not None and not (choice in _TOOL_CHOICES or (isinstance(choice, dict) and "type" in choice)):
        raise invalid("tool_choice must be none, auto, required or a tool choice object", ("tool_choice",))
