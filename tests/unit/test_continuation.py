"""Continuation of a paused turn on in-process fakes: client-tool results re-enter it, the session
restorer loads them for this round only, and the reasoner accepts them only when their call ids
match the pending client calls exactly."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.errors import StateConflict, TurnNotRecorded
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, InvokeResult
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    SESSION_ID,
    TOOL_RUNS,
    TURN_ID,
    FakeLlm,
    answer,
    calls,
    catalog_with_counted_tool,
    drive,
    envelope,
    make_context,
    make_state,
    record_turn,
)
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.steps import client_tool_continuation_resolver, client_tool_session_restorer, reasoner

OPEN_FILE = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}


def _paused(*posted: tuple[str, str]) -> TurnState:
    """A turn waiting for client calls ``call_a`` and ``call_b``, with ``posted`` (call id, output) results in."""
    state = make_state(status=TurnStatus.RUNNING, continuation=True)
    state.usage.llm_calls = 1
    state.ledger = [
        LedgerEntry(call_id="call_s", name="get_current_time", arguments="{}", kind="server", iteration=1,
                    status="done", output="now"),
        LedgerEntry(call_id="call_a", name="open_file", arguments="{}", kind="client", iteration=1),
        LedgerEntry(call_id="call_b", name="open_file", arguments="{}", kind="client", iteration=1),
    ]  # fmt: skip
    state.providers.client_results = [{"call_id": call_id, "output": output} for call_id, output in posted]
    return state


def _verify(state: TurnState) -> tuple[Continue | None, str | None]:
    """Run the reasoner on a re-entered state: the move it asks for, or its mismatch message."""
    result = reasoner.run(make_context(), envelope(StepName.REASONER, round=1, hop=5, iteration=1), state)
    if result.ok:
        assert isinstance(result.value, Continue)
        return result.value, None
    assert result.error is not None and result.error.code is ErrorCode.CONTINUATION_MISMATCH
    return None, result.error.message


def _verification(state: TurnState) -> dict[str, object]:
    (step,) = [step for step in state.trace if step.kind == "reentry_verification"]
    return step.data


# The reasoner's verification


def test_matching_results_answer_the_pending_calls_and_the_model_is_asked_again() -> None:
    state = _paused(("call_b", "B"), ("call_a", "A"))
    move, _ = _verify(state)
    assert move == Continue(StepName.COMPOSE, 2)
    assert [(e.call_id, e.status, e.output) for e in state.ledger if e.kind == "client"] == [
        ("call_a", "done", "A"), ("call_b", "done", "B")
    ]  # fmt: skip
    assert state.transcript[-2:] == [
        {"type": "function_call_output", "call_id": "call_a", "output": "A"},
        {"type": "function_call_output", "call_id": "call_b", "output": "B"},
    ]
    assert state.status is TurnStatus.RUNNING and not state.continuation
    assert state.providers.client_results == [] and state.pending_tool_calls == []
    assert _verification(state)["ok"] is True


def test_missing_result_fails_continuation_mismatch_and_answers_nothing() -> None:
    state = _paused(("call_a", "A"))
    _, message = _verify(state)
    assert message is not None and "missing results for ['call_b']" in message
    assert [e.status for e in state.ledger if e.kind == "client"] == ["pending", "pending"]
    assert state.providers.client_results == []
    assert _verification(state)["ok"] is False and _verification(state)["missing"] == ["call_b"]


def test_repeated_result_fails_continuation_mismatch() -> None:
    _, message = _verify(_paused(("call_a", "A"), ("call_b", "B"), ("call_b", "B again")))
    assert message is not None and "not expected" in message and "call_b" in message


def test_result_for_a_call_answered_in_an_earlier_round_fails_continuation_mismatch() -> None:
    state = _paused(("call_a", "A"), ("call_b", "B"), ("call_0", "old"))
    state.ledger.insert(0, LedgerEntry(call_id="call_0", name="open_file", arguments="{}", kind="client",
                                       iteration=1, status="done", output="old"))  # fmt: skip
    _, message = _verify(state)
    assert message is not None and "not expected" in message and "call_0" in message


def test_result_for_a_server_call_fails_continuation_mismatch() -> None:
    _, message = _verify(_paused(("call_a", "A"), ("call_b", "B"), ("call_s", "forged")))
    assert message is not None and "not expected" in message and "call_s" in message


def test_result_for_an_unknown_call_id_fails_continuation_mismatch() -> None:
    state = _paused(("call_a", "A"), ("call_b", "B"), ("call_nope", "x"))
    _, message = _verify(state)
    assert message is not None and "unknown call ids ['call_nope']" in message
    assert _verification(state)["unknown"] == ["call_nope"]


def test_continuation_resolver_hands_the_results_to_the_reasoner_for_verification() -> None:
    state = _paused(("call_a", "A"))
    state.continuation = False
    env = envelope(StepName.CLIENT_TOOL_CONTINUATION_RESOLVER, round=1, hop=4)
    result = client_tool_continuation_resolver.run(make_context(), env, state)
    assert result.unwrap() == Continue(StepName.REASONER)
    assert state.continuation
    (step,) = [step for step in state.trace if step.kind == "continuation_resolved"]
    assert (step.data["expected"], step.data["posted"]) == (["call_a", "call_b"], ["call_a"])


# The session restorer of a re-entry


def _pause_turn(ctx: StepContext) -> str:
    """Run a turn until its model's call of ``open_file`` pauses it; returns that call's id."""
    drive(ctx, record_turn(ctx, tools=[OPEN_FILE]))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value
    return "call_1"


def _restore(ctx: StepContext, *, round: int) -> tuple[TurnState, InvokeResult[Next]]:
    state = ctx.states.load(TURN_ID)
    assert state is not None
    env = envelope(StepName.CLIENT_TOOL_SESSION_RESTORER, round=round, hop=1)
    return state, client_tool_session_restorer.run(ctx, env, state)


def test_restorer_loads_the_results_posted_for_this_round_and_the_sessions_mode() -> None:
    ctx = make_context(FakeLlm(calls(("call_1", "open_file", {}))))
    call_id = _pause_turn(ctx)
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": call_id, "output": "body"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    ctx.sessions.set_mode(SESSION_ID, turn_id=TURN_ID, seq=0, from_mode="general", to_mode="ddr-authoring",
                          reason=None, org_id="o", user_id="u", now=FIXED_NOW)  # fmt: skip
    state, result = _restore(ctx, round=1)
    assert result.unwrap() == Continue(StepName.SESSION_CONTEXT_RESOLVER)
    assert state.providers.client_results == [{"call_id": call_id, "output": "body"}]
    assert (state.round, state.status, state.mode) == (1, TurnStatus.RUNNING, "ddr-authoring")


def test_restorer_waits_while_the_posted_results_are_not_visible_yet() -> None:
    ctx = make_context(FakeLlm(calls(("call_1", "open_file", {}))))
    _pause_turn(ctx)
    with pytest.raises(TurnNotRecorded):
        _restore(ctx, round=1)


def test_restorer_fails_continuation_mismatch_for_a_re_entry_of_an_earlier_round() -> None:
    ctx = make_context(FakeLlm(calls(("call_1", "open_file", {}))))
    call_id = _pause_turn(ctx)
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": call_id, "output": "body"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    _, result = _restore(ctx, round=0)
    assert result.error is not None and result.error.code is ErrorCode.CONTINUATION_MISMATCH


def test_restorer_fails_session_not_found_when_the_session_is_gone() -> None:
    state = make_state(session_id="sess_" + "9" * 32)
    env = envelope(StepName.CLIENT_TOOL_SESSION_RESTORER, round=1, hop=1)
    result = client_tool_session_restorer.run(make_context(), env, state)
    assert result.error is not None and result.error.code is ErrorCode.SESSION_NOT_FOUND


# Through the driver


def test_paused_turn_completes_when_its_results_come_back() -> None:
    llm = FakeLlm(calls(("call_1", "open_file", {})), answer("done with the file"))
    ctx = make_context(llm)
    call_id = _pause_turn(ctx)
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": call_id, "output": "body"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.COMPLETED.value and row.output_text == "done with the file"
    assert llm.requests[-1]["input"][-1] == {"type": "function_call_output", "call_id": call_id, "output": "body"}
    assert [step["data"]["exit_mode"] for step in row.trace if step["kind"] == "exit"] == [2, 1]


def test_paused_turn_fails_continuation_mismatch_when_its_results_do_not_match() -> None:
    llm = FakeLlm(calls(("call_1", "open_file", {})))
    ctx = make_context(llm)
    _pause_turn(ctx)
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": "call_other", "output": "x"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.FAILED.value and row.error is not None
    assert row.error["code"] == ErrorCode.CONTINUATION_MISMATCH.value
    assert len(llm.requests) == 1


def test_server_tool_runs_once_across_a_pause_and_resume_when_a_response_mixes_both() -> None:
    # Given a response that calls a server tool and a client tool
    key = uuid.uuid4().hex
    llm = FakeLlm(calls(("call_s", "counted_tool", {"key": key}), ("call_c", "open_file", {})), answer("both done"))
    ctx = make_context(llm, catalog=catalog_with_counted_tool())
    drive(ctx, record_turn(ctx, tools=[OPEN_FILE]))
    # Then the turn waits for the client call only, with the server call already run
    row = ctx.turns.get(TURN_ID)
    assert row is not None and [call["call_id"] for call in row.pending_tool_calls] == ["call_c"]
    assert TOOL_RUNS[key] == 1
    # When the client's result comes back
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": "call_c", "output": "C"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    # Then the turn completes, the server call did not run again, and the model saw both outputs
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.output_text == "both done" and TOOL_RUNS[key] == 1
    outputs = [item for item in llm.requests[-1]["input"] if item.get("type") == "function_call_output"]
    assert [(item["call_id"], item["output"]) for item in outputs] == [("call_s", f"counted {key}"), ("call_c", "C")]


def test_a_re_entry_that_finds_the_state_from_before_its_pause_carries_on_from_the_checkpoint() -> None:
    # Given a turn paused by a task (a message per layer) whose last save has not reached Redis: Redis still holds
    # the state the model call's task saved, before the pause
    llm = FakeLlm(calls(("call_1", "open_file", {})), answer("done with the file"))
    ctx = make_context(llm, task_boundaries="layer")
    saved: list[TurnState] = []
    save = ctx.states.save

    def keeping(state: TurnState, **options: Any) -> None:
        save(state, **options)
        saved.append(state.model_copy(deep=True))

    ctx.states.save = keeping  # type: ignore[method-assign]
    call_id = _pause_turn(ctx)
    before_pause = [state for state in saved if state.status is TurnStatus.RUNNING][-1]  # the model call's
    assert before_pause.status is TurnStatus.RUNNING and saved[-1].status is TurnStatus.REQUIRES_CLIENT_TOOLS
    ctx.states.drop(TURN_ID)
    before_pause.version = 0
    save(before_pause, ttl_seconds=60)
    # When the client, which saw the pause, posts its results and the re-entry runs
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": call_id, "output": "body"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    # Then it carried on from the paused state the commit checkpointed, not from the one Redis held
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.COMPLETED.value, row.error
    assert llm.requests[-1]["input"][-1] == {"type": "function_call_output", "call_id": call_id, "output": "body"}
    # and the late save of the paused state, from the state it loaded, is refused: the turn moved on
    with pytest.raises(StateConflict):
        save(saved[-1].model_copy(update={"version": saved[-1].version - 1}), ttl_seconds=60)
