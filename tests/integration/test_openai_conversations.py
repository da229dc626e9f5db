"""``/openai/v1/conversations`` through the official ``openai`` SDK against the real gateway and workers.

A conversation is a session: created with metadata and initial items (recorded as a seed turn the
session's first turn sees as history), retrieved, updated, and listed item by item.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.conversations import Conversation, Message

from shared.openai.ids import session_of_conversation
from tests.conftest import KEY_A, KEY_B
from tests.integration.conftest import System

pytestmark = pytest.mark.integration

ITEMS: list[Any] = [
    {"type": "message", "role": "developer", "content": "Answer in one word."},
    {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
]


@pytest.fixture
def client(system: System) -> Iterator[openai.OpenAI]:
    """The SDK, pointed at the gateway with organisation A's key."""
    with openai.OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def other_org(system: System) -> Iterator[openai.OpenAI]:
    """The SDK with organisation B's key."""
    with openai.OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_B, max_retries=0) as sdk:
        yield sdk


def _session(conversation_id: str) -> str:
    session_id = session_of_conversation(conversation_id)
    assert session_id is not None, conversation_id
    return session_id


def _texts(messages: list[Any]) -> list[tuple[str, str]]:
    pairs = []
    for message in messages:
        assert isinstance(message, Message), message
        (part,) = message.content
        pairs.append((message.role, getattr(part, "text", "")))
    return pairs


def test_conversation_is_created_retrieved_and_updated_through_the_sdk(client: openai.OpenAI) -> None:
    # Given a conversation created with metadata
    created = client.conversations.create(metadata={"topic": "demo"}, items=ITEMS)
    assert isinstance(created, Conversation)
    assert created.id.startswith("conv_")
    assert created.object == "conversation"
    assert created.metadata == {"topic": "demo"}

    # When it is retrieved, Then it is the same conversation
    assert client.conversations.retrieve(created.id) == created

    # When its metadata is updated, Then the new metadata replaces the old, on every read
    updated = client.conversations.update(created.id, metadata={"stage": "two"})
    assert (updated.id, updated.created_at, updated.metadata) == (created.id, created.created_at, {"stage": "two"})
    assert client.conversations.retrieve(created.id).metadata == {"stage": "two"}


def test_items_list_answers_the_initial_items_as_sdk_messages(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(items=ITEMS)

    ascending = client.conversations.items.list(conversation.id, order="asc")
    descending = client.conversations.items.list(conversation.id)

    assert _texts(ascending.data) == [
        ("developer", "Answer in one word."), ("user", "My name is Ada."), ("assistant", "Noted."),
    ]  # fmt: skip
    assert [part.type for message in ascending.data for part in message.content] == [
        "input_text", "input_text", "output_text",
    ]  # fmt: skip
    assert [item.id for item in descending.data] == [item.id for item in ascending.data][::-1]
    assert ascending.has_more is False
    # The SDK follows the cursor (``after`` = ``last_id``) page by page.
    paged = client.conversations.items.list(conversation.id, order="asc", limit=1)
    assert [item.id for item in paged] == [item.id for item in ascending.data]


def test_first_turn_of_a_conversation_gives_the_model_its_initial_items_first(
    system: System, client: openai.OpenAI
) -> None:
    # Given a conversation created with three messages
    conversation = client.conversations.create(items=ITEMS)
    session_id = _session(conversation.id)
    marker = f"hello {uuid.uuid4().hex[:10]}"

    # When a turn runs on its session through /v1/turns
    turn = system.run_turn({"session_id": session_id, "input": marker})

    # Then the model's input starts with the initial items, and the new message follows them
    assert turn["status"] == "completed", turn
    (request,) = system.llm_requests(marker)
    history = [(item.get("role"), item.get("content")) for item in request["input"][:3]]
    assert history == [("developer", "Answer in one word."), ("user", "My name is Ada."), ("assistant", "Noted.")]
    newest = max(index for index, item in enumerate(request["input"]) if marker in str(item.get("content")))
    assert newest > 2
    # And the conversation's items are the seed's, then the turn's
    items = client.conversations.items.list(conversation.id, order="asc")
    assert _texts(items.data)[3:] == [("user", marker), ("assistant", turn["output_text"])]


def test_another_organisations_conversation_is_not_found(client: openai.OpenAI, other_org: openai.OpenAI) -> None:
    conversation = client.conversations.create(metadata={"owner": "a"})

    with pytest.raises(openai.NotFoundError):
        other_org.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        other_org.conversations.update(conversation.id, metadata={"owner": "b"})
    with pytest.raises(openai.NotFoundError):
        other_org.conversations.items.list(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve("conv_" + "0" * 32)
    assert client.conversations.retrieve(conversation.id).metadata == {"owner": "a"}


@pytest.mark.parametrize(
    ("call", "param"),
    [
        ({"items": [ITEMS[0], {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]},
         "items[1].type"),
        ({"items": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x"}]}]},
         "items[0].content[0].type"),
        ({"extra_body": {"unknown_field": 1}}, "unknown_field"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k"),
    ],
)  # fmt: skip
def test_create_refuses_what_a_conversation_cannot_hold_naming_it(
    client: openai.OpenAI, call: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(**call)
    assert refused.value.status_code == 400
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("query", "param"), [({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"order": "up"}, "order"),
                         ({"after": "msg_nonsense"}, "after"), ({"after": "msg_\x00"}, "after")],
)  # fmt: skip
def test_items_list_refuses_a_bad_parameter_naming_it(client: openai.OpenAI, query: dict[str, Any], param: str) -> None:
    conversation = client.conversations.create(items=ITEMS)
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.items.list(conversation.id, **query)
    assert refused.value.param == param
