"""The wire shapes of ``/openai/v1/conversations``: OpenAI's conversation create and update bodies, the
``Conversation`` and the list of its items.

A field OpenAI's bodies do not have is refused (400 naming it under ``/openai/v1``); ``metadata`` follows
the rules of a turn's (``shared.models.turn.ClientMetadata``, OpenAI's own).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.models.turn import ClientMetadata

__all__ = ["MAX_INITIAL_ITEMS", "Conversation", "ConversationCreate", "ConversationItemList", "ConversationUpdate"]

MAX_INITIAL_ITEMS = 20
"""How many items a conversation may be created with (OpenAI's limit)."""


class ConversationCreate(BaseModel):
    """``POST /openai/v1/conversations``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    metadata: ClientMetadata | None = None
    """The client's own string values for the conversation."""
    items: Annotated[list[Any], Field(max_length=MAX_INITIAL_ITEMS)] | None = None
    """Initial items: messages only (checked by the service, which names the item it refuses)."""


class ConversationUpdate(BaseModel):
    """``POST /openai/v1/conversations/{conversation_id}``: new metadata (replacing the old)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    metadata: ClientMetadata | None
    """The conversation's metadata from now on (null: none)."""


class Conversation(BaseModel):
    """OpenAI's ``Conversation``: a session, by its ``conv_…`` id."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    id: str
    """``conv_<session hex>`` (``shared.openai.ids``)."""
    object: Literal["conversation"] = "conversation"
    created_at: int
    """The session's creation, in Unix seconds."""
    metadata: dict[str, str]
    """The client's metadata (``{}`` when none was given)."""


class ConversationItemList(BaseModel):
    """OpenAI's ``ConversationItemList``: a page of a conversation's items."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    """``message`` items, in the order asked for."""
    first_id: str | None
    """The first item's id (None on an empty page)."""
    last_id: str | None
    """The last item's id: the ``after`` of the next page (None on an empty page)."""
    has_more: bool
    """Whether items follow this page."""
