"""The session steps of a turn's entry on in-process fakes: which mode a new or restored session
runs in, whose session a turn may use, the conversation history, and what the context providers
start with (the welcome only when the session is new)."""

from __future__ import annotations

from datetime import timedelta

from shared.result import ErrorCode
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    SESSION_ID,
    FakeLlm,
    answer,
    drive,
    envelope,
    make_context,
    make_state,
    record_turn,
)
from workers.context import StepContext
from workers.next_step import Continue
from workers.steps import context_provider_initializer, session_context_resolver, session_creator, session_restorer


def _session(ctx: StepContext, mode: str, *, org_id: str = "org") -> str:
    state = make_state()
    ctx.sessions.create_if_absent(session_id=state.session_id, org_id=org_id, user_id="user", mode=mode, now=FIXED_NOW)
    return state.session_id


def _session_mode(ctx: StepContext, session_id: str) -> str | None:
    session = ctx.sessions.get(session_id)
    return None if session is None else session.mode


# session_creator


def test_new_session_starts_in_the_requested_mode_when_the_catalog_knows_it() -> None:
    ctx = make_context()
    state = make_state(requested_mode="ddr-authoring", mode=None)
    result = session_creator.run(ctx, envelope(StepName.SESSION_CREATOR, hop=1), state)
    assert result.unwrap() == Continue(StepName.SESSION_CONTEXT_RESOLVER)
    assert state.mode == "ddr-authoring" and _session_mode(ctx, state.session_id) == "ddr-authoring"


def test_new_session_starts_in_the_default_mode_when_the_requested_one_left_the_catalog() -> None:
    ctx = make_context()
    state = make_state(requested_mode="retired-mode", mode=None)
    session_creator.run(ctx, envelope(StepName.SESSION_CREATOR, hop=1), state)
    assert state.mode == ctx.catalog.default_mode == _session_mode(ctx, state.session_id)


def test_session_creator_delivered_twice_creates_the_session_once_and_keeps_its_mode() -> None:
    ctx = make_context()
    _session(ctx, "rag-indexing")
    state = make_state(requested_mode="ddr-authoring", mode=None)
    session_creator.run(ctx, envelope(StepName.SESSION_CREATOR, hop=1), state)
    assert state.mode == "rag-indexing"
    assert [step.data["created"] for step in state.trace if step.kind == "session_created"] == [False]


# session_restorer


def test_follow_up_turn_runs_in_the_sessions_persisted_mode_not_the_clients() -> None:
    ctx = make_context()
    _session(ctx, "ddr-authoring")
    state = make_state(new_session=False, requested_mode="rag-indexing", mode=None)
    result = session_restorer.run(ctx, envelope(StepName.SESSION_RESTORER, hop=1), state)
    assert result.unwrap() == Continue(StepName.SESSION_CONTEXT_RESOLVER)
    assert state.mode == "ddr-authoring"


def test_follow_up_turn_fails_session_not_found_for_another_orgs_session() -> None:
    ctx = make_context()
    _session(ctx, "general", org_id="another-org")
    state = make_state(new_session=False)
    result = session_restorer.run(ctx, envelope(StepName.SESSION_RESTORER, hop=1), state)
    assert result.error is not None and result.error.code is ErrorCode.SESSION_NOT_FOUND


# session_context_resolver


def test_mode_that_left_the_catalog_falls_back_to_the_default() -> None:
    ctx = make_context()
    state = make_state(new_session=False, mode="retired-mode")
    result = session_context_resolver.run(ctx, envelope(StepName.SESSION_CONTEXT_RESOLVER, hop=2), state)
    assert result.unwrap() == Continue(StepName.CONTEXT_PROVIDER_INITIALIZER)
    assert state.mode == ctx.catalog.default_mode


def test_follow_up_turn_gets_the_sessions_earlier_turns_as_history() -> None:
    ctx = make_context(FakeLlm(answer("first answer")))
    drive(ctx, record_turn(ctx, "first question", turn_id="turn_" + "a" * 32))
    state = make_state(session_id=SESSION_ID, new_session=False, created_at=FIXED_NOW + timedelta(seconds=5))
    session_context_resolver.run(ctx, envelope(StepName.SESSION_CONTEXT_RESOLVER, hop=2), state)
    assert state.history == [
        {"type": "message", "role": "user", "content": "first question"},
        {"type": "message", "role": "assistant", "content": "first answer"},
    ]


# context_provider_initializer


def test_welcome_is_armed_when_the_session_is_new() -> None:
    ctx = make_context()
    state = make_state(new_session=True, mode="general", transcript=[])
    result = context_provider_initializer.run(ctx, envelope(StepName.CONTEXT_PROVIDER_INITIALIZER, hop=3), state)
    assert result.unwrap() == Continue(StepName.REASONER)
    general = ctx.catalog.get("general")
    assert general is not None and state.providers.turn_context == [general.welcome]
    assert state.providers.session_context == [f"Session {state.session_id} is in mode 'general'."]
    assert state.transcript == [{"type": "message", "role": "user", "content": state.user_input}]


def test_welcome_is_not_armed_for_a_follow_up_turn() -> None:
    ctx = make_context()
    state = make_state(new_session=False, mode="general")
    context_provider_initializer.run(ctx, envelope(StepName.CONTEXT_PROVIDER_INITIALIZER, hop=3), state)
    assert state.providers.turn_context == []


def test_re_entry_goes_to_the_continuation_and_keeps_the_turns_transcript() -> None:
    ctx = make_context()
    transcript = [{"type": "message", "role": "user", "content": "hello"}, {"type": "function_call", "call_id": "c"}]
    state = make_state(new_session=True, mode="general", transcript=list(transcript))
    env = envelope(StepName.CONTEXT_PROVIDER_INITIALIZER, round=1, hop=3)
    result = context_provider_initializer.run(ctx, env, state)
    assert result.unwrap() == Continue(StepName.CLIENT_TOOL_CONTINUATION_RESOLVER)
    assert state.transcript == transcript and state.providers.turn_context == []
