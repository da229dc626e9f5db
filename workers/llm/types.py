"""In-process values of one Responses API exchange: the parsed response and its function calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FunctionCall", "LlmResponse", "response_from_dict", "response_to_dict"]


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A ``function_call`` output item."""

    call_id: str
    name: str
    arguments: str
    """The model's arguments, a JSON string, exactly as it sent them."""
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class LlmResponse:
    """What one LLM call produced, normalised."""

    response_id: str
    output_text: str | None
    """The concatenated ``output_text`` parts of the message items, or None when there were none."""
    function_calls: tuple[FunctionCall, ...] = ()
    output_items: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    """The raw output items, for replay in the next request of the same turn."""
    input_tokens: int = 0
    output_tokens: int = 0


def response_to_dict(response: LlmResponse) -> dict[str, Any]:
    """A JSON-ready form of ``response``, for the turn state."""
    return {
        "response_id": response.response_id,
        "output_text": response.output_text,
        "function_calls": [
            {"call_id": c.call_id, "name": c.name, "arguments": c.arguments, "item_id": c.item_id}
            for c in response.function_calls
        ],
        "output_items": list(response.output_items),
        "input_tokens": response.input_tokens,
        "output_tokens": response.output_tokens,
    }


def response_from_dict(data: dict[str, Any]) -> LlmResponse:
    """The inverse of :func:`response_to_dict`."""
    return LlmResponse(
        response_id=str(data["response_id"]),
        output_text=data.get("output_text"),
        function_calls=tuple(FunctionCall(**call) for call in data.get("function_calls", [])),
        output_items=tuple(data.get("output_items", [])),
        input_tokens=int(data.get("input_tokens", 0)),
        output_tokens=int(data.get("output_tokens", 0)),
    )
