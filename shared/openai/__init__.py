"""What both sides need to know of the OpenAI-compatible face (``/openai/v1``): its ids and the turn extras.

The gateway translates OpenAI's requests into turns and renders turns through OpenAI's types
(``api_gateway.openai``); nothing below it branches on the dialect. Workers read a turn's
:class:`~shared.openai.extras.TurnExtras` as plain turn options (extra input items, instructions, a
model and its call options); the webhook outbox reads ``face`` to pick the event's shape.
"""

from shared.openai.extras import FACE_OPENAI, TurnExtras
from shared.openai.ids import (
    conversation_id,
    is_response_id,
    parse_response_id,
    response_id,
    session_of_conversation,
)

__all__ = [
    "FACE_OPENAI",
    "TurnExtras",
    "conversation_id",
    "is_response_id",
    "parse_response_id",
    "response_id",
    "session_of_conversation",
]
