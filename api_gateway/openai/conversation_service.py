"""ConversationService: an Aptix session seen through OpenAI's Conversation types.

A conversation is a session (``conv_<session hex>``, ``shared.openai.ids``). Creating one records a
session for the caller in the catalog's default mode, with the client's metadata and, when initial
items were given, a completed *seed* turn holding them as its transcript (``shared.db.conversations``):
the session's first turn sees them as history, as it would see an earlier turn. Its items are the
session's transcript items, every turn's, in order (``api_gateway.openai.conversation_items``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from api_gateway.ids import new_session_id, new_turn_id
from api_gateway.openai.conversation_items import parse_item_id, rendered
from api_gateway.openai.conversation_models import (
    Conversation,
    ConversationCreate,
    ConversationItemList,
    ConversationUpdate,
)
from api_gateway.openai.errors import invalid
from api_gateway.openai.items import model_items, text_of
from api_gateway.services.errors import InvalidRequest, NotFound
from shared.db.conversations import ConversationRepository, SeedTurn, UnknownItem
from shared.db.records import NewTurn
from shared.db.sessions import SessionRecord, SessionRepository
from shared.modes import ModeCatalog
from shared.openai import ids as openai_ids

__all__ = ["ConversationService"]


class ConversationService:
    """Create, read and update conversations and list their items; built once per gateway."""

    def __init__(
        self,
        *,
        conversations: ConversationRepository,
        sessions: SessionRepository,
        catalog: ModeCatalog,
        clock: Callable[[], datetime],
    ) -> None:
        self._conversations = conversations
        self._sessions = sessions
        self._catalog = catalog
        self._clock = clock

    def create(self, body: ConversationCreate, *, org_id: str, user_id: str) -> Conversation:
        """Record a new session for the caller, with its metadata and, if any, its initial items as a seed turn.

        Args:
            body: the request.
            org_id: the caller's organisation.
            user_id: the caller.

        Returns:
            The new conversation.

        Raises:
            InvalidRequest: an initial item that is not a text message, naming it (``items[1].type``).
        """
        transcript, items = _initial_messages(body.items or [])
        session_id = new_session_id()
        seed = None
        if transcript:
            request: dict[str, Any] = {"input": "", "conversation_items": items}
            seed = SeedTurn(
                turn=NewTurn(
                    turn_id=new_turn_id(), session_id=session_id, org_id=org_id, user_id=user_id, new_session=True,
                    requested_mode=None, request=request,
                    request_hash=hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest(),
                ),
                transcript=transcript,
            )  # fmt: skip
        session = self._conversations.create(
            session_id=session_id, org_id=org_id, user_id=user_id, mode=self._catalog.default_mode,
            metadata=body.metadata, seed=seed, now=self._clock(),
        )  # fmt: skip
        return _conversation(session)

    def get(self, conversation_id: str, *, org_id: str) -> Conversation:
        """The caller's conversation.

        Raises:
            NotFound: ``not_found``, when ``org_id`` has no such conversation.
        """
        return _conversation(self._session(conversation_id, org_id=org_id))

    def update(self, conversation_id: str, body: ConversationUpdate, *, org_id: str) -> Conversation:
        """Replace the conversation's metadata.

        Raises:
            NotFound: ``not_found``, when ``org_id`` has no such conversation.
        """
        session_id = openai_ids.session_of_conversation(conversation_id)
        session = None
        if session_id is not None:
            session = self._conversations.set_metadata(session_id, org_id=org_id, metadata=body.metadata)
        if session is None:
            raise _not_found(conversation_id)
        return _conversation(session)

    def items(
        self, conversation_id: str, *, org_id: str, limit: int, order: Literal["asc", "desc"], after: str | None
    ) -> ConversationItemList:
        """A page of the conversation's items: its turns' transcript items, as ``message`` items.

        Args:
            conversation_id: the conversation's id.
            org_id: the caller's organisation.
            limit: at most this many items (the route checks 1 to 100).
            order: ``asc`` (oldest first) or ``desc`` (newest first).
            after: the id of the item the page follows, in that order.

        Returns:
            The page, with ``has_more`` set when items follow it.

        Raises:
            NotFound: ``not_found``, when ``org_id`` has no such conversation.
            InvalidRequest: ``after`` names no item of the conversation.
        """
        session = self._session(conversation_id, org_id=org_id)
        cursor = None
        if after is not None:
            cursor = parse_item_id(after)
            if cursor is None:
                raise _bad_after(after)
        try:
            # One more than asked for says whether another page follows.
            entries = self._conversations.items(session.session_id, limit=limit + 1, order=order, after=cursor)
        except UnknownItem as exc:
            raise _bad_after(after or "") from exc
        data = [rendered(entry) for entry in entries[:limit]]
        return ConversationItemList(
            data=data,
            first_id=data[0]["id"] if data else None,
            last_id=data[-1]["id"] if data else None,
            has_more=len(entries) > limit,
        )

    def _session(self, conversation_id: str, *, org_id: str) -> SessionRecord:
        session_id = openai_ids.session_of_conversation(conversation_id)
        session = None if session_id is None else self._sessions.get(session_id, org_id=org_id)
        if session is None:
            raise _not_found(conversation_id)
        return session


def _initial_messages(items: list[Any]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(role, text) of each initial item, and the items as the model is given them.

    Raises:
        InvalidRequest: an item that is not a message (``items[i].type``), a role or content part the face
            does not take, or text that cannot be stored (NUL, lone surrogates).
    """
    if not items:
        return [], []
    for index, item in enumerate(items):
        kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else "message"
        if kind != "message":  # a non-object is left to model_items, which says so
            raise invalid(f"item type {kind!r} is not supported in a conversation's items: messages only",
                          ("items", index, "type"))  # fmt: skip
    normalised = model_items(items, param=("items",))
    transcript: list[tuple[str, str]] = []
    for index, item in enumerate(normalised):
        text = text_of(item["content"])
        if "\x00" in text or not _encodable(text):
            raise invalid("message text must be valid Unicode without NUL characters", ("items", index, "content"))
        transcript.append((str(item["role"]), text))
    return transcript, normalised


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _conversation(session: SessionRecord) -> Conversation:
    return Conversation(
        id=openai_ids.conversation_id(session.session_id),
        created_at=int(session.created_at.timestamp()),
        metadata=session.client_metadata or {},
    )


def _not_found(conversation_id: str) -> NotFound:
    return NotFound("not_found", f"conversation {conversation_id!r} does not exist")


def _bad_after(after: str) -> InvalidRequest:
    message = f"after {after!r} is not an item of this conversation"
    return InvalidRequest(message, [{"loc": ["query", "after"], "msg": message, "type": "value_error"}])
