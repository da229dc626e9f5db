"""``/openai/v1/conversations``: OpenAI's Conversations API over sessions (``ConversationService``).

Create (with metadata and initial message items), retrieve, update the metadata, and list the items.
Errors are the services' own; under ``/openai/v1`` ``api_gateway.errors`` renders them in OpenAI's shape.
"""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openai.conversation_models import (
    Conversation,
    ConversationCreate,
    ConversationItemList,
    ConversationUpdate,
)
from api_gateway.openai.errors import OPENAI_PREFIX

__all__ = ["router"]

router = APIRouter(prefix=OPENAI_PREFIX + "/conversations", route_class=AuthenticatedRoute, include_in_schema=False)

ConversationId = Annotated[str, Path(description="The conversation's id (`conv_…`); another organisation's is 404.")]


@router.post("", response_model=Conversation)
async def create_conversation(
    caller: Caller, gateway: Gateway, body: Annotated[ConversationCreate | None, Body()] = None
) -> Conversation:
    """A new conversation: a session in the catalog's default mode, seeded with the initial items."""
    create = functools.partial(
        gateway.conversation_service.create, body or ConversationCreate(), org_id=caller.org_id,
        user_id=caller.user_id,
    )  # fmt: skip
    return await run_in_threadpool(create)


@router.get("/{conversation_id}", response_model=Conversation)
async def get_conversation(conversation_id: ConversationId, caller: Caller, gateway: Gateway) -> Conversation:
    """The conversation."""
    return await run_in_threadpool(gateway.conversation_service.get, conversation_id, org_id=caller.org_id)


@router.post("/{conversation_id}", response_model=Conversation)
async def update_conversation(
    conversation_id: ConversationId, body: ConversationUpdate, caller: Caller, gateway: Gateway
) -> Conversation:
    """The conversation with new metadata."""
    update = functools.partial(gateway.conversation_service.update, conversation_id, body, org_id=caller.org_id)
    return await run_in_threadpool(update)


@router.get("/{conversation_id}/items", response_model=ConversationItemList)
async def list_items(
    conversation_id: ConversationId,
    caller: Caller,
    gateway: Gateway,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    after: Annotated[str | None, Query(max_length=128)] = None,
) -> ConversationItemList:
    """A page of the conversation's items (newest first unless ``order=asc``)."""
    page = functools.partial(
        gateway.conversation_service.items, conversation_id, org_id=caller.org_id, limit=limit, order=order,
        after=after,
    )  # fmt: skip
    return await run_in_threadpool(page)
