"""A checked Responses create request as a turn: its ``TurnRequest`` and its ``TurnExtras``.

One translation for both ways a response is created: alone (``ResponseService``) and as a line of a
batch (``OpenAIBatchService``).
"""

from __future__ import annotations

from pydantic import ValidationError

from api_gateway.openai.errors import invalid
from api_gateway.openai.items import user_text
from api_gateway.openai.requests import ResponseCreate
from shared.models.turn import TurnRequest
from shared.openai import FACE_OPENAI, TurnExtras

__all__ = ["NO_USER_TEXT", "turn_parts"]

NO_USER_TEXT = "(input items)"
"""What a turn records as its input when the items hold no user message (outputs of earlier calls only)."""


def turn_parts(
    request: ResponseCreate,
    *,
    session_id: str | None,
    idempotency_key: str | None,
    custom_id: str | None = None,
    echo: dict[str, object] | None = None,
) -> tuple[TurnRequest, TurnExtras]:
    """The turn a create request describes.

    Args:
        request: the checked request.
        session_id: the session the turn continues (None: a new conversation, in ``request.mode``).
        idempotency_key: the turn's own ``idempotency_key``.
        custom_id: a batch line's ``custom_id`` (recorded in the extras for the output file).
        echo: a batch line's echoed fields (likewise).

    Returns:
        The turn's request and its extras.

    Raises:
        InvalidRequest: the turn request refuses a value (400 naming it).
    """
    items = request.input_items
    text = user_text(items) if not request.input_is_text else items[0]["content"][0]["text"]
    try:
        turn_request = TurnRequest(
            session_id=session_id,
            mode=request.mode if session_id is None else None,
            input=text if text.strip() else NO_USER_TEXT,
            tools=request.tools,
            metadata=request.metadata,
            idempotency_key=idempotency_key,
            webhook_url=request.webhook_url,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise invalid(f"{first['msg']}", tuple(first["loc"])) from exc
    extras = TurnExtras(
        input_items=None if request.input_is_text else items,
        instructions=request.instructions,
        model=request.model,
        model_options=request.model_options,
        face=FACE_OPENAI,
        custom_id=custom_id,
        echo=echo,
    )
    return turn_request, extras
