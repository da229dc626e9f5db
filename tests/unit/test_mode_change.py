"""The mid-turn mode change (``agent_change_mode``) on in-process fakes: what it persists, what it
arms for the next model call of the same turn, how a bad target is refused, and that a change
recorded once is not recorded twice."""

from __future__ import annotations

import json
from typing import Any

from shared.modes import CHANGE_MODE_TOOL
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    TURN_ID,
    FakeLlm,
    answer,
    calls,
    drive,
    envelope,
    make_context,
    make_state,
    record_turn,
)
from workers.context import StepContext
from workers.steps import compose, execute_server_tools


def _context() -> StepContext:
    ctx = make_context()
    state = make_state()
    ctx.sessions.create_if_absent(
        session_id=state.session_id, org_id=state.org_id, user_id=state.user_id, mode="general", now=FIXED_NOW
    )
    return ctx


def _change(ctx: StepContext, state: TurnState, *changes: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one response's mode changes through the server-tool step; returns each call's result."""
    first = len(state.ledger)
    for index, arguments in enumerate(changes):
        state.ledger.append(LedgerEntry(call_id=f"call_{first + index}", name=CHANGE_MODE_TOOL,
                                        arguments=json.dumps(arguments), kind="server", iteration=1))  # fmt: skip
    result = execute_server_tools.run(ctx, envelope(StepName.EXECUTE_SERVER_TOOLS, hop=6, iteration=1), state)
    assert result.ok, result
    return [json.loads(entry.output or "") for entry in state.ledger[first:]]


def _history(ctx: StepContext, state: TurnState) -> list[tuple[str | None, str, str | None]]:
    return [(row.from_mode, row.to_mode, row.reason) for row in ctx.sessions.mode_history(state.session_id)]


def test_change_to_a_known_mode_is_persisted_and_becomes_the_turns_mode() -> None:
    ctx = _context()
    state = make_state(mode="general")
    (result,) = _change(ctx, state, {"targetMode": "ddr-authoring", "reason": "a design record"})
    assert result["success"] is True and result["mode"] == "ddr-authoring"
    assert state.mode == "ddr-authoring"
    changes = [(change.from_mode, change.to_mode, change.reason) for change in state.mode_changes]
    assert changes == [("general", "ddr-authoring", "a design record")]
    session = ctx.sessions.get(state.session_id)
    assert session is not None and session.mode == "ddr-authoring"
    assert _history(ctx, state) == [("general", "ddr-authoring", "a design record")]
    assert [step.data["mode"] for step in state.trace if step.kind == "mode_change"] == ["ddr-authoring"]


def test_change_arms_the_new_modes_welcome_prompt_and_tools_for_the_next_call() -> None:
    ctx = _context()
    state = make_state(mode="general")
    _change(ctx, state, {"targetMode": "rag-indexing"})
    rag = ctx.catalog.get("rag-indexing")
    assert rag is not None and rag.welcome
    assert state.providers.turn_context == [rag.welcome]
    request = compose.compose_request(ctx, state)
    assert request["instructions"].startswith(rag.instructions)
    assert {"type": "message", "role": "developer", "content": rag.welcome} in request["input"]
    assert [tool["name"] for tool in request["tools"]] == [CHANGE_MODE_TOOL]  # rag-indexing offers no other tool


def test_change_to_an_unknown_mode_is_a_normal_result_and_the_mode_stays() -> None:
    ctx = _context()
    state = make_state(mode="general")
    (result,) = _change(ctx, state, {"targetMode": "astrology"})
    assert result["success"] is False and result["mode"] == "general"
    assert "astrology" in result["message"] and result["valid_modes"] == ctx.catalog.mode_names
    assert state.mode == "general" and state.mode_changes == [] and state.providers.turn_context == []
    session = ctx.sessions.get(state.session_id)
    assert session is not None and session.mode == "general" and _history(ctx, state) == []
    assert any(step.kind == "mode_change_rejected" for step in state.trace)


def test_branch_flag_is_surfaced_in_the_result_and_the_change() -> None:
    ctx = _context()
    state = make_state(mode="general")
    (result,) = _change(ctx, state, {"targetMode": "ddr-authoring", "branch": True})
    assert result["branch"] is True and state.mode_changes[0].branch is True


def test_two_changes_in_one_response_keep_the_last_and_record_both() -> None:
    ctx = _context()
    state = make_state(mode="general")
    _change(ctx, state, {"targetMode": "ddr-authoring"}, {"targetMode": "rag-indexing"})
    assert state.mode == "rag-indexing"
    assert _history(ctx, state) == [("general", "ddr-authoring", None), ("ddr-authoring", "rag-indexing", None)]


def test_change_is_recorded_once_when_its_step_runs_again_from_an_earlier_state() -> None:
    # Given a change applied, and a copy of the state from before it (a turn carried on from a checkpoint)
    ctx = _context()
    state = make_state(mode="general")
    before = state.model_copy(deep=True)
    _change(ctx, state, {"targetMode": "ddr-authoring"})
    # When Redis loses the state and the same change runs again on the earlier copy
    ctx.states.drop(state.turn_id)
    _change(ctx, before, {"targetMode": "ddr-authoring"})
    # Then the turn's mode is applied again, but the session's history holds the change once
    assert before.mode == "ddr-authoring"
    assert _history(ctx, state) == [("general", "ddr-authoring", None)]


def test_model_call_after_a_change_carries_the_new_mode_in_the_same_turn() -> None:
    llm = FakeLlm(calls(("call_1", CHANGE_MODE_TOOL, {"targetMode": "ddr-authoring"})), answer("switched"))
    ctx = make_context(llm)
    drive(ctx, record_turn(ctx))
    ddr = ctx.catalog.get("ddr-authoring")
    assert ddr is not None
    first, second = llm.requests
    assert not first["instructions"].startswith(ddr.instructions)
    assert second["instructions"].startswith(ddr.instructions)
    assert {"type": "message", "role": "developer", "content": ddr.welcome} in second["input"]
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.mode == "ddr-authoring"
