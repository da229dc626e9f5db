"""TurnExtras: turn options beyond ``TurnRequest``, recorded with the turn's request under ``extras``.

The OpenAI face (``/openai/v1/responses``) sets them; workers read them as plain options of the turn,
whatever face recorded it:

- ``input_items``: the turn's own input as Responses API input items (messages, ``function_call`` and
  ``function_call_output`` items, as the client gave them), sent to the model after the conversation
  history instead of the single user message ``input`` makes;
- ``instructions``: added to the mode's prompt layers for every model call of the turn;
- ``model``: the model the turn's calls use (instead of the mode's or ``APTIX_LLM_MODEL``);
- ``model_options``: fields copied into each model request as given (``temperature``, ``top_p``,
  ``max_output_tokens``, ``tool_choice``, ``parallel_tool_calls``, ``text``, ``reasoning``, ...);
- ``face``: which face recorded the turn (``openai``), for the views (the webhook event's shape) only;
- ``custom_id`` and ``echo``: for a request of a batch of that face (``/openai/v1/batches``), the line's
  ``custom_id`` and the fields its ``Response`` echoes, for the views (the output file) only.

A turn recorded through ``/v1/turns`` has none of them, and its model requests are what they were.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EXTRAS_KEY", "FACE_OPENAI", "TurnExtras"]

EXTRAS_KEY = "extras"
"""The key of the recorded request (``NewTurn.request``) that holds a turn's extras."""
FACE_OPENAI = "openai"
"""``TurnExtras.face`` of a turn created through ``/openai/v1``."""


class TurnExtras(BaseModel):
    """Options of a turn beyond ``TurnRequest`` (module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    input_items: list[dict[str, Any]] | None = None
    """The turn's own input items, sent as given after the history; None: one user message of ``input``."""
    instructions: str | None = None
    """Added to the mode's prompt layers (after them) in every model call of the turn."""
    model: str | None = None
    """The model of the turn's calls; None: the mode's model, else ``APTIX_LLM_MODEL``."""
    model_options: dict[str, Any] = Field(default_factory=dict)
    """Copied into every model request of the turn as given."""
    face: str | None = None
    """The face that recorded the turn (``openai``), else None (``/v1/turns``)."""
    custom_id: str | None = None
    """The ``custom_id`` of the batch line the turn answers (``/openai/v1/batches``), else None."""
    echo: dict[str, Any] | None = None
    """For a batch line: the request's fields its ``Response`` echoes (a response created alone keeps them in
    its ``responses`` row instead)."""

    @classmethod
    def of(cls, request: dict[str, Any]) -> TurnExtras:
        """The extras of a recorded request (none: the defaults)."""
        extras = request.get(EXTRAS_KEY)
        return cls.model_validate(extras) if isinstance(extras, dict) else _NONE


_NONE = TurnExtras()
