"""ConversationService as the gateway wires it, on SQLite: conversations as sessions, the seed turn of initial
items, metadata, items.

The routes over it (and the ``openai`` SDK as their client) are covered by
tests/integration/test_openai_conversations.py.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, Literal

import pytest
from openai.types.conversations import Conversation as SdkConversation
from openai.types.conversations import ConversationItemList as SdkItemList

from api_gateway.errors import service_error_status
from api_gateway.openai.conversation_models import ConversationCreate, ConversationUpdate
from api_gateway.openai.errors import param_of
from api_gateway.services import InvalidRequest, NotFound
from shared.db.records import NewTurn, TurnOutcome
from shared.models.turn import TurnStatus, Usage
from shared.openai.ids import session_of_conversation
from tests.unit.fakes import FIXED_NOW, ORG, USER, Gateway, make_context, make_state
from workers.steps.session_context_resolver import load_history

ITEMS: list[Any] = [
    {"type": "message", "role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "input_text", "text": "My name is Ada."}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ada."}]},
]


class Conversations:
    """The service as ``connect_gateway`` wires it (tests.unit.fakes.Gateway), with the repositories beside it."""

    def __init__(self) -> None:
        gateway = Gateway()
        self.clock = gateway.clock
        self.sessions = gateway.sessions
        self.turns = gateway.turns
        self.catalog = gateway.wired.catalog
        self.service = gateway.conversations

    def create(self, *, org_id: str = ORG, **body: Any) -> str:
        """Create a conversation; its id."""
        return self.service.create(ConversationCreate.model_validate(body), org_id=org_id, user_id=USER).id

    def later_turn(self, session_id: str, *, user: str, answer: str) -> str:
        """Record and complete a turn of the session one minute on; its id."""
        self.clock.now += timedelta(minutes=1)
        turn_id = f"turn_{len(self.turns.for_session(session_id)):032x}"
        turn = NewTurn(
            turn_id=turn_id, session_id=session_id, org_id=ORG, user_id=USER, new_session=False, requested_mode=None,
            request={"input": user}, request_hash="h",
        )  # fmt: skip
        self.turns.create(turn, now=self.clock.now, deadline_at=self.clock.now + timedelta(minutes=5))
        outcome = TurnOutcome(
            status=TurnStatus.COMPLETED, mode="general", output_text=answer, pending_tool_calls=[], mode_changes=[],
            error=None, usage=Usage(), trace=[],
        )  # fmt: skip
        self.turns.commit(turn_id, outcome, transcript=[("user", user), ("assistant", answer)], snapshot={},
                          now=self.clock.now)  # fmt: skip
        return turn_id

    def items(self, conversation: str, **page: Any) -> list[dict[str, Any]]:
        """The data of one page of the conversation's items."""
        values: dict[str, Any] = {"limit": 20, "order": "asc", "after": None, **page}
        return self.service.items(conversation, org_id=ORG, **values).data


def _session(conversation: str) -> str:
    session_id = session_of_conversation(conversation)
    assert session_id is not None
    return session_id


def test_create_answers_a_conversation_and_records_its_session_in_the_default_mode() -> None:
    # Given a gateway, When a conversation is created with metadata and no items
    gateway = Conversations()
    created = gateway.service.create(ConversationCreate(metadata={"topic": "demo"}), org_id=ORG, user_id=USER)

    # Then it is a session of the caller, in the default mode, with the metadata and no turn
    SdkConversation.model_validate(created.model_dump())
    assert created.model_dump() == {
        "id": created.id, "object": "conversation", "created_at": int(FIXED_NOW.timestamp()),
        "metadata": {"topic": "demo"},
    }  # fmt: skip
    session = gateway.sessions.get(_session(created.id), org_id=ORG)
    assert session is not None
    assert (session.mode, session.user_id) == (gateway.catalog.default_mode, USER)
    assert session.client_metadata == {"topic": "demo"}
    assert gateway.turns.for_session(session.session_id) == []


def test_create_without_metadata_answers_empty_metadata() -> None:
    gateway = Conversations()
    assert gateway.service.get(gateway.create(), org_id=ORG).metadata == {}


def test_create_records_initial_items_as_one_completed_seed_turn() -> None:
    gateway = Conversations()
    session_id = _session(gateway.create(items=ITEMS))

    (seed,) = gateway.turns.for_session(session_id)
    assert seed.status is TurnStatus.COMPLETED
    assert seed.created_at == seed.completed_at == FIXED_NOW
    assert seed.deadline_at is None
    assert seed.request["input"] == ""
    assert [item["role"] for item in seed.request["conversation_items"]] == ["system", "user", "assistant"]
    assert seed.trace == []


def test_first_turn_history_carries_the_initial_items_in_order() -> None:
    # Given a conversation created with three messages
    gateway = Conversations()
    session_id = _session(gateway.create(items=ITEMS))

    # When the workers load the history of the session's next turn (a second later)
    ctx = dataclasses.replace(make_context(), sessions=gateway.sessions, turns=gateway.turns)
    state = make_state(session_id=session_id, new_session=False, created_at=FIXED_NOW + timedelta(seconds=1))
    load_history(ctx, state)

    # Then the model is given the three messages as history
    assert state.history == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant", "content": "Hello Ada."},
    ]


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([ITEMS[0], {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}], "items[1].type"),
        ([{"type": "reasoning", "summary": []}], "items[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "items[0].content[0].type"),
        ([{"role": "tool", "content": "x"}], "items[0].role"),
        (["hello"], "items[0]"),
        ([{"role": "user", "content": "nul \x00"}], "items[0].content"),
        ([{"role": "user", "content": "lone \ud800"}], "items[0].content"),
    ],
)
def test_create_refuses_an_item_that_is_not_a_text_message_naming_it(items: list[Any], param: str) -> None:
    gateway = Conversations()
    with pytest.raises(InvalidRequest) as refused:
        gateway.create(items=items)
    assert param_of(refused.value.details[0]["loc"]) == param
    assert service_error_status(refused.value) == 422  # 400 under /openai/v1 (api_gateway.openai.errors)


def test_get_answers_not_found_for_another_organisation_or_an_unknown_id() -> None:
    gateway = Conversations()
    conversation = gateway.create(metadata={"a": "b"})
    for other in (conversation, "conv_" + "0" * 32, "sess_" + "0" * 32, "nonsense"):
        org = "org_b" if other == conversation else ORG
        with pytest.raises(NotFound) as missing:
            gateway.service.get(other, org_id=org)
        assert missing.value.code == "not_found"


def test_update_replaces_the_metadata() -> None:
    gateway = Conversations()
    conversation = gateway.create(metadata={"a": "1", "b": "2"})

    updated = gateway.service.update(conversation, ConversationUpdate(metadata={"c": "3"}), org_id=ORG)

    assert updated.metadata == {"c": "3"}
    assert gateway.service.get(conversation, org_id=ORG).metadata == {"c": "3"}
    cleared = gateway.service.update(conversation, ConversationUpdate(metadata=None), org_id=ORG)
    assert cleared.metadata == {}


def test_update_of_another_organisations_conversation_is_not_found_and_changes_nothing() -> None:
    gateway = Conversations()
    conversation = gateway.create(metadata={"a": "1"})
    with pytest.raises(NotFound):
        gateway.service.update(conversation, ConversationUpdate(metadata={}), org_id="org_b")
    assert gateway.service.get(conversation, org_id=ORG).metadata == {"a": "1"}


def test_items_lists_every_turns_transcript_as_message_items_in_order() -> None:
    # Given a conversation seeded with three messages and one later turn
    gateway = Conversations()
    conversation = gateway.create(items=ITEMS)
    turn_id = gateway.later_turn(_session(conversation), user="And mine?", answer="Yours is Bob.")

    # When its items are listed oldest first
    page = gateway.service.items(conversation, org_id=ORG, limit=20, order="asc", after=None)

    # Then each message is an item in OpenAI's shape, the seed's first
    SdkItemList.model_validate(page.model_dump())
    assert [(item["role"], item["content"][0]["text"]) for item in page.data] == [
        ("system", "Be brief."), ("user", "My name is Ada."), ("assistant", "Hello Ada."),
        ("user", "And mine?"), ("assistant", "Yours is Bob."),
    ]  # fmt: skip
    assert page.data[3] == {
        "id": f"msg_{turn_id.removeprefix('turn_')}_0", "type": "message", "role": "user", "status": "completed",
        "content": [{"type": "input_text", "text": "And mine?"}],
    }  # fmt: skip
    assert page.data[4]["content"] == [{"type": "output_text", "text": "Yours is Bob.", "annotations": []}]
    assert (page.first_id, page.last_id, page.has_more) == (page.data[0]["id"], page.data[4]["id"], False)


def test_items_are_newest_first_by_default_order_and_their_ids_are_stable() -> None:
    gateway = Conversations()
    conversation = gateway.create(items=ITEMS)
    gateway.later_turn(_session(conversation), user="u", answer="a")

    ascending = gateway.items(conversation, order="asc")
    descending = gateway.items(conversation, order="desc")

    assert descending == ascending[::-1]
    assert gateway.items(conversation, order="asc") == ascending
    assert len({item["id"] for item in ascending}) == 5


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_items_page_with_after_and_limit_walks_every_item_once(order: Literal["asc", "desc"]) -> None:
    gateway = Conversations()
    conversation = gateway.create(items=ITEMS)
    for n in range(3):
        gateway.later_turn(_session(conversation), user=f"u{n}", answer=f"a{n}")
    everything = gateway.items(conversation, order=order, limit=100)

    walked: list[dict[str, Any]] = []
    after = None
    while True:
        page = gateway.service.items(conversation, org_id=ORG, limit=2, order=order, after=after)
        walked.extend(page.data)
        if not page.has_more:
            break
        after = page.last_id

    assert walked == everything
    assert len(walked) == 9


def test_items_of_a_conversation_without_items_is_an_empty_page() -> None:
    gateway = Conversations()
    page = gateway.service.items(gateway.create(), org_id=ORG, limit=20, order="desc", after=None)
    assert (page.data, page.first_id, page.last_id, page.has_more) == ([], None, None, False)


@pytest.mark.parametrize("after", ["msg_nonsense", "msg_" + "0" * 32 + "_0", "OTHER"])
def test_items_after_an_item_not_in_the_conversation_is_refused_naming_after(after: str) -> None:
    gateway = Conversations()
    conversation = gateway.create(items=ITEMS)
    if after == "OTHER":  # an item of another conversation
        after = gateway.items(gateway.create(items=ITEMS))[0]["id"]
    with pytest.raises(InvalidRequest) as refused:
        gateway.items(conversation, after=after)
    assert param_of(refused.value.details[0]["loc"]) == "after"


def test_items_of_another_organisations_conversation_is_not_found() -> None:
    gateway = Conversations()
    conversation = gateway.create(items=ITEMS)
    with pytest.raises(NotFound):
        gateway.service.items(conversation, org_id="org_b", limit=20, order="desc", after=None)
