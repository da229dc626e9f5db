"""The driver's own rules on in-process fakes: idempotent redelivery, step leases, cancellation, what a step raises,
the step-map guard and carrying a turn on from its database checkpoint when Redis lost its state."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from shared.errors import LlmError, TurnFailed
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode
from shared.state import Lease, MemoryStateStore
from shared.state.admission import AdmissionQueue
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
    record_turn,
    with_store,
)
from workers import retry
from workers.context import StepContext
from workers.driver import Dispatch, run_step
from workers.llm.types import LlmResponse
from workers.step_map import ALWAYS_ALLOWED, STEP_MAP, StepFunction

OPEN_FILE = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}


def _memory(ctx: StepContext) -> MemoryStateStore:
    assert isinstance(ctx.states, MemoryStateStore)
    return ctx.states


# Idempotent redelivery


def test_redelivered_step_does_not_run_again_when_it_already_ran() -> None:
    llm = FakeLlm(answer("once"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    first = run_step(ctx, llm_step)
    # When the message of the model call is delivered again
    again = run_step(ctx, llm_step)
    # Then the model is not asked twice, and the message it sent is sent again (it may have been lost)
    assert len(llm.requests) == 1
    assert first is not None and again == Dispatch(first.envelope)


def test_redelivered_step_sends_nothing_when_its_next_message_already_ran() -> None:
    ctx = make_context(FakeLlm(answer("x")))
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    reasoner_step = run_step(ctx, llm_step)
    assert reasoner_step is not None
    run_step(ctx, reasoner_step.envelope)
    assert run_step(ctx, llm_step) is None


# Leases


def test_step_gives_its_lease_back_when_it_ends() -> None:
    ctx = make_context(FakeLlm(answer("x")))
    env = record_turn(ctx)
    run_step(ctx, env)
    assert _memory(ctx).claim(Lease(TURN_ID, env.step_key, "next-worker"), ttl_seconds=30)


class _SaveFails(MemoryStateStore):
    """A state store whose saves fail (Redis went away between the step and its save)."""

    def save(self, state: Any, **_options: Any) -> None:
        raise redis.ConnectionError("Connection refused")


def test_step_gives_its_lease_back_and_is_sent_again_later_when_its_state_cannot_be_saved() -> None:
    ctx = with_store(make_context(FakeLlm(answer("x"))), _SaveFails())
    env = record_turn(ctx)
    dispatch = run_step(ctx, env)
    assert dispatch is not None and dispatch.envelope.step_key == env.step_key and dispatch.countdown > 0
    assert _memory(ctx).claim(Lease(TURN_ID, env.step_key, "next-worker"), ttl_seconds=30)


class _LeaseWatchingLlm(FakeLlm):
    """Notes, during each call, the step leases the worker process holds."""

    def __init__(self, *answers: LlmResponse) -> None:
        super().__init__(*answers)
        self.ctx: StepContext | None = None
        self.held: list[list[Lease]] = []

    def create(self, request: dict[str, Any]) -> LlmResponse:
        assert self.ctx is not None
        self.held.append(self.ctx.leases.held())
        return super().create(request)


def test_step_lease_is_held_for_renewal_while_the_step_runs_and_let_go_after() -> None:
    llm = _LeaseWatchingLlm(answer("x"))
    ctx = make_context(llm)
    llm.ctx = ctx
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    run_step(ctx, llm_step)
    held_during_calls = [[(lease.turn_id, lease.step_key) for lease in held] for held in llm.held]
    assert held_during_calls == [[(TURN_ID, llm_step.step_key)]]
    assert ctx.leases.held() == []


# Cancellation


def test_cancelled_turn_runs_no_further_step() -> None:
    llm = FakeLlm(answer("x"))
    ctx = make_context(llm)
    reasoner_step = drive(ctx, record_turn(ctx), until=StepName.REASONER)[-1].envelope
    ctx.cancel_flags.cancel_many([TURN_ID], ttl_seconds=60)
    assert run_step(ctx, reasoner_step) is None
    state = ctx.states.load(TURN_ID)
    assert state is not None and reasoner_step.step_key not in state.steps_done
    assert llm.requests == []


def test_commit_step_runs_even_when_the_turn_was_cancelled() -> None:
    ctx = make_context(FakeLlm(answer("done")))
    persist_step = drive(ctx, record_turn(ctx), until=StepName.PERSIST)[-1].envelope
    ctx.cancel_flags.cancel_many([TURN_ID], ttl_seconds=60)
    assert run_step(ctx, persist_step) is None
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.COMPLETED.value


# The step-map guard


def test_move_the_step_map_does_not_allow_fails_the_turn_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a step map whose compose may move nowhere (but to the commit, which every step may reach)
    monkeypatch.setitem(STEP_MAP, StepName.COMPOSE, replace(STEP_MAP[StepName.COMPOSE], next=frozenset()))
    llm = FakeLlm(answer("never"))
    ctx = make_context(llm)
    compose_step = drive(ctx, record_turn(ctx), until=StepName.COMPOSE)[-1].envelope
    # When compose asks for the model call
    dispatch = run_step(ctx, compose_step)
    # Then the driver refuses the move: the turn goes to its commit, failed, and the model is never called
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    drive(ctx, dispatch.envelope)
    row = ctx.turns.get(TURN_ID)
    assert row is not None
    assert row.status == TurnStatus.FAILED.value and row.error is not None
    assert row.error["code"] == ErrorCode.INTERNAL_ERROR.value and "forbids" in row.error["message"]
    assert llm.requests == []


def test_every_move_a_step_module_makes_is_one_the_step_map_allows() -> None:
    for step, spec in STEP_MAP.items():
        assert _moves(spec.run) <= spec.next | ALWAYS_ALLOWED, step


def test_every_move_the_step_map_allows_is_one_its_step_module_makes() -> None:
    for step, spec in STEP_MAP.items():
        assert spec.next <= _moves(spec.run), step


def _moves(run: StepFunction) -> set[StepName]:
    """The steps ``run``'s module names in ``Continue(StepName.X, ...)`` (each target must be such a literal)."""
    source = Path(inspect.getsourcefile(run) or "").read_text()
    moves: set[StepName] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Continue":
            target = node.args[0] if node.args else None
            assert isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name), ast.unparse(node)
            assert target.value.id == "StepName", ast.unparse(node)
            moves.add(StepName[target.attr])
    return moves


def test_step_missing_from_the_step_map_fails_the_turn_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(STEP_MAP, StepName.COMPOSE)
    ctx = make_context(FakeLlm(answer("never")))
    compose_step = drive(ctx, record_turn(ctx), until=StepName.COMPOSE)[-1].envelope
    dispatch = run_step(ctx, compose_step)
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.error is not None and state.error.code is ErrorCode.INTERNAL_ERROR
    assert "no step 'compose'" in state.error.message


# What a step raises


def test_step_that_raises_unexpectedly_fails_the_turn_internal_error() -> None:
    ctx = make_context(FakeLlm(ValueError("a bug")))
    drive(ctx, record_turn(ctx))
    row = ctx.turns.get(TURN_ID)
    assert row is not None
    assert row.status == TurnStatus.FAILED.value and row.error is not None
    assert row.error["code"] == ErrorCode.INTERNAL_ERROR.value and "llm_call" in row.error["message"]


def test_step_that_meets_an_infrastructure_error_runs_again_later() -> None:
    llm = FakeLlm(redis.ConnectionError("Connection refused"), answer("second try"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    dispatch = run_step(ctx, llm_step)
    assert dispatch is not None and dispatch.envelope.step_key == llm_step.step_key and dispatch.countdown > 0
    drive(ctx, dispatch.envelope)
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.output_text == "second try"


def test_driver_fails_the_turn_when_the_policy_gives_up_on_a_trouble_outside_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a policy whose row for a busy step gives up at once (the driver applies whatever the table says)
    monkeypatch.setitem(retry.POLICY, retry.Trouble.STEP_BUSY,  # type: ignore[arg-type]  # a test's own table
                        retry.Rule(None, retry.Budget.SPENT, ErrorCode.INTERNAL_ERROR))  # fmt: skip
    ctx = make_context()
    env = record_turn(ctx)
    _memory(ctx).claim(Lease(TURN_ID, env.step_key, "other"), ttl_seconds=30)
    # When the step's message finds the lease held elsewhere
    assert run_step(ctx, env) is None
    # Then the turn is failed with the row's code
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "failed" and row.error is not None
    assert row.error["code"] == "internal_error"


def test_failure_outside_any_step_fails_the_turn_internal_error_instead_of_stranding_it() -> None:
    ctx = with_store(make_context(), _BeginFails())
    # The turn is recorded failed and there is nothing to send: the driver raises for the task to report
    with pytest.raises(TurnFailed) as raised:
        run_step(ctx, record_turn(ctx))
    assert raised.value.code == ErrorCode.INTERNAL_ERROR.value
    assert raised.value.__cause__ is None and raised.value.__suppress_context__, "the bug's traceback is logged"
    row = ctx.turns.get(TURN_ID)
    assert row is not None
    assert row.status == TurnStatus.FAILED.value and row.error is not None
    assert row.error["code"] == ErrorCode.INTERNAL_ERROR.value


def test_a_turn_failed_outside_any_step_leaves_flight_and_frees_its_admission_slot() -> None:
    # Given an interactive turn the gateway sent: marked in flight and counted in its organisation's slots
    admission = AdmissionQueue(fakeredis.FakeRedis())
    ctx = replace(with_store(make_context(), _BeginFails()), admission=admission)
    first = record_turn(ctx)
    ctx.in_flight.mark_alive([TURN_ID], until=FIXED_NOW.timestamp() + 60)
    admission.admit_now("o", [TURN_ID], now=FIXED_NOW.timestamp())
    # When the driver fails it outside any step
    with pytest.raises(TurnFailed):
        run_step(ctx, first)
    # Then its slot is free at once (not only when the scheduler's sweep notices), and its marker is gone
    assert admission.where("o", [TURN_ID]) == {TURN_ID: None}
    assert ctx.in_flight.alive_until([TURN_ID]) == {}


# What the task reports (Flower shows a task whose step failed its turn as failed)


def test_step_that_fails_the_turn_says_so_with_the_message_that_persists_the_failure() -> None:
    ctx = make_context(FakeLlm(LlmError("bad request: model not found", status_code=400)))
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    dispatch = run_step(ctx, llm_step)
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    assert dispatch.failed is not None and dispatch.failed.code is ErrorCode.LLM_ERROR
    # The persist that records the failure succeeds: only the step that failed the turn reports it
    assert run_step(ctx, dispatch.envelope) is None
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.error is not None
    assert row.status == TurnStatus.FAILED.value and row.error["code"] == ErrorCode.LLM_ERROR.value
    assert row.error["message"] == dispatch.failed.message


def test_no_message_of_a_turn_that_completes_says_the_turn_failed() -> None:
    ctx = make_context(FakeLlm(answer("fine")))
    sent = drive(ctx, record_turn(ctx))
    assert [d.envelope.step for d in sent][-1] is StepName.PERSIST
    assert [d.failed for d in sent] == [None] * len(sent)


def test_entry_step_that_fails_the_turn_ends_its_task_with_the_failure() -> None:
    # Given a follow-up turn whose session does not exist (session_restorer runs inline in the entry task)
    ctx = make_context(FakeLlm(answer("never")))
    dispatch = run_step(ctx, record_turn(ctx, new_session=False))
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    assert dispatch.failed is not None and dispatch.failed.code is ErrorCode.SESSION_NOT_FOUND


def test_persist_that_raises_fails_the_turn_in_a_message_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a persist that raises once (a bug), which would otherwise run again inline in its own task
    real = STEP_MAP[StepName.PERSIST]
    raised: list[bool] = []

    def persist_once_broken(ctx: StepContext, env: TurnEnvelope, state: Any) -> Any:
        if not raised:
            raised.append(True)
            raise ValueError("a bug in persist")
        return real.run(ctx, env, state)

    monkeypatch.setitem(STEP_MAP, StepName.PERSIST, replace(real, run=persist_once_broken))
    ctx = make_context(FakeLlm(answer("x")))
    persist_step = drive(ctx, record_turn(ctx), until=StepName.PERSIST)[-1].envelope
    # When it runs, the failure is reported by this task, and the retry of persist is a message of its own
    dispatch = run_step(ctx, persist_step)
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    assert dispatch.envelope.step_key != persist_step.step_key
    assert dispatch.failed is not None and dispatch.failed.code is ErrorCode.INTERNAL_ERROR
    assert run_step(ctx, dispatch.envelope) is None
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.FAILED.value


def test_turn_failed_carries_only_the_code_and_a_bounded_message_and_survives_pickling() -> None:
    import pickle

    error = TurnFailed(ErrorCode.TOOL_FAILED.value, "x" * 1000)
    copy = pickle.loads(pickle.dumps(error))  # a prefork child sends it to its parent this way
    assert (copy.code, copy.message) == (error.code, error.message)
    assert copy.args == (ErrorCode.TOOL_FAILED.value, error.message)
    assert len(error.message) == TurnFailed.MESSAGE_LIMIT and error.message.endswith("…")
    assert str(TurnFailed("llm_error", "no")) == "llm_error: no"


class _BeginFails(MemoryStateStore):
    """A state store that breaks (a bug, not an outage) when a step starts."""

    def begin(
        self, lease: Lease, *, ttl_seconds: int, check_cancel: bool = True, alive_until: float | None = None
    ) -> Any:
        raise RuntimeError("a bug in the store")


# Checkpoints, the frontier and the in-flight marker


def test_step_records_the_message_it_sends_as_the_turns_frontier_until_the_chain_ends() -> None:
    ctx = make_context(FakeLlm(answer("x")))
    dispatch = run_step(ctx, record_turn(ctx))
    state = ctx.states.load(TURN_ID)
    assert dispatch is not None and state is not None
    assert state.next_envelope == dispatch.envelope.model_dump(mode="json")
    drive(ctx, dispatch.envelope)
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.next_envelope is None


def test_model_call_that_must_be_retried_writes_no_checkpoint_and_keeps_the_turn_marked_in_flight() -> None:
    ctx = make_context(FakeLlm(LlmError("slow down", status_code=429, retryable=True, retry_after=7)))
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    dispatch = run_step(ctx, llm_step)
    assert dispatch is not None and dispatch.envelope.step is StepName.LLM_CALL and dispatch.countdown >= 7
    assert ctx.turns.load_snapshot(TURN_ID) is None
    expected = FIXED_NOW.timestamp() + dispatch.countdown + ctx.settings.reconciler_deadline_seconds
    assert _memory(ctx).markers[TURN_ID] == pytest.approx(expected, abs=0.001)


def test_model_retry_count_is_forgotten_once_the_model_answers() -> None:
    llm = FakeLlm(LlmError("slow down", status_code=429, retryable=True, retry_after=1), answer("at last"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    retry = run_step(ctx, llm_step)
    assert retry is not None
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.model_retry is not None and state.model_retry.calls == 1
    run_step(ctx, retry.envelope)
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.model_retry is None
    assert ctx.turns.load_snapshot(TURN_ID) is not None  # the answer is checkpointed once the step moved on


# Carrying a turn on from the database when Redis lost its state


def test_message_of_a_turn_nobody_recorded_is_dropped() -> None:
    ctx = make_context()
    assert run_step(ctx, envelope(StepName.COMPOSE, hop=4, iteration=1)) is None
    assert ctx.states.load(TURN_ID) is None


def test_paused_turn_resumes_from_its_checkpoint_when_redis_lost_its_state() -> None:
    llm = FakeLlm(calls(("call_1", "open_file", {})), answer("resumed"))
    ctx = make_context(llm)
    drive(ctx, record_turn(ctx, tools=[OPEN_FILE]))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value
    # Given Redis lost the paused turn's state, and the client posted its result
    _memory(ctx).flush()
    results = [{"call_id": "call_1", "output": "file body"}]
    round_ = ctx.turns.accept_tool_results(TURN_ID, results=results, now=FIXED_NOW, deadline_at=FIXED_NOW)
    assert round_ == 1
    # When the re-entry message runs
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    # Then the turn carries on from its checkpoint and the model sees the client's result
    row = ctx.turns.get(TURN_ID)
    assert row is not None
    assert row.status == TurnStatus.COMPLETED.value and row.output_text == "resumed"
    assert {"type": "function_call_output", "call_id": "call_1", "output": "file body"} in llm.requests[-1]["input"]


def test_turn_carried_on_from_its_checkpoint_gets_its_conversation_history_back() -> None:
    # Given a session with one answered turn, and a second turn whose model calls a server tool
    llm = FakeLlm(answer("first answer"), calls(("call_1", "get_current_time", {})), answer("second answer"))
    ctx = make_context(llm)
    drive(ctx, record_turn(ctx, "first question", turn_id="turn_" + "a" * 32))
    later = FIXED_NOW + timedelta(seconds=5)
    second = record_turn(ctx, "second question", new_session=False, created_at=later)
    drive(ctx, second, until=StepName.EXECUTE_SERVER_TOOLS)
    # When Redis loses the state after the model call (the history is not in the checkpoint)
    _memory(ctx).flush()
    checkpoint = ctx.turns.load_snapshot(TURN_ID)
    assert checkpoint is not None and "history" not in checkpoint
    drive(ctx, TurnEnvelope.model_validate(checkpoint["next_envelope"]))
    # Then the model's next call still carries the earlier turn
    history = [{"type": "message", "role": "user", "content": "first question"},
               {"type": "message", "role": "assistant", "content": "first answer"}]  # fmt: skip
    assert llm.requests[-1]["input"][:2] == history
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.output_text == "second answer"
