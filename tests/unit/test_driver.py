"""The driver on in-process fakes: a whole turn step by step, checkpoints, carrying on after Redis
lost the state, at-most-once server tools, the model retry budget."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import redis
from sqlalchemy.exc import OperationalError

from shared.db.tool_runs import ToolRun, ToolRunRepository
from shared.db.turns import NewTurn
from shared.errors import LlmError
from shared.models.envelope import BATCH_PRIORITY, INTERACTIVE_PRIORITY, TurnEnvelope
from shared.state import Lease, LedgerEntry, MemoryStateStore
from shared.task_names import Queue, StepName, TaskBoundaries
from shared.turn_ending import CANCELLED_BY_CLIENT
from tests.unit.fakes import (
    FIXED_NOW,
    TOOL_RUNS,
    Clock,
    FakeLlm,
    catalog_with_counted_tool,
    make_context,
    make_state,
    memory_store,
    with_store,
)  # fmt: skip
from workers.batch_slots import BatchSlots
from workers.context import StepContext
from workers.driver import Dispatch, run_step
from workers.llm.types import FunctionCall, LlmResponse
from workers.metrics import MessageTally
from workers.steps import execute_server_tools
from workers.tasks import ran

TURN_ID = "turn_" + "1" * 32
T = TypeVar("T")


def _record_turn(ctx: StepContext, text: str = "hello") -> TurnEnvelope:
    ctx.turns.create(
        NewTurn(turn_id=TURN_ID, session_id="sess_" + "1" * 32, org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": text}, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    return TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER)


def _drive(ctx: StepContext, env: TurnEnvelope, *, until: StepName | None = None, iteration: int = 0) -> list[Dispatch]:
    """Run messages one after another (ignoring countdowns) until the chain ends or reaches ``until``
    at ``iteration`` or later."""
    sent: list[Dispatch] = []
    dispatch: Dispatch | None = Dispatch(env)
    while dispatch is not None and not (dispatch.envelope.step is until and dispatch.envelope.iteration >= iteration):
        dispatch = run_step(ctx, dispatch.envelope)
        if dispatch is not None:
            sent.append(dispatch)
    return sent


def _tool_call(key: str) -> LlmResponse:
    call = FunctionCall(call_id="call_1", name="counted_tool", arguments=json.dumps({"key": key}))
    return LlmResponse(response_id="r1", output_text=None, function_calls=(call,))


def test_turn_completes_and_leaves_its_checkpoint_and_no_marker() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="hi")))
    _drive(ctx, _record_turn(ctx))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed" and row.output_text == "hi" and row.deadline_at is None
    assert TURN_ID not in memory_store(ctx).markers
    assert ctx.turns.load_snapshot(TURN_ID) is not None


def test_the_save_that_ends_the_chain_merges_the_tokens_its_commit_wrote() -> None:
    # Given a turn whose model answers with 40 + 2 tokens
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="hi", input_tokens=40, output_tokens=2)))
    store = memory_store(ctx)
    _drive(ctx, _record_turn(ctx))
    # Then its commit's tokens were merged, on the day it was created, by the save that ended its chain
    assert store.tokens == {("o", FIXED_NOW.date(), TURN_ID): 42}
    row = ctx.turns.get(TURN_ID)
    assert row is not None and (row.usage["input_tokens"], row.usage["output_tokens"]) == (40, 2)


def test_model_answer_is_checkpointed_and_not_asked_again_when_redis_loses_the_state() -> None:
    llm = FakeLlm(LlmResponse(response_id="r", output_text="once"))
    ctx = make_context(llm)
    sent = _drive(ctx, _record_turn(ctx), until=StepName.REASONER, iteration=1)
    # Given the model answered and the answer was checkpointed, when Redis loses everything
    memory_store(ctx).flush()
    checkpoint = ctx.turns.load_snapshot(TURN_ID)
    assert checkpoint is not None and checkpoint["last_response"] is not None
    # Then the message the checkpoint carries on with finishes the turn without a second call
    assert TurnEnvelope.model_validate(checkpoint["next_envelope"]) == sent[-1].envelope
    _drive(ctx, sent[-1].envelope)
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed" and row.output_text == "once"
    assert len(llm.requests) == 1


def test_message_that_is_not_where_the_checkpoint_carries_on_is_dropped_when_redis_lost_the_state() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")))
    sent = _drive(ctx, _record_turn(ctx), until=StepName.REASONER, iteration=1)
    memory_store(ctx).flush()
    compose = next(d.envelope for d in sent if d.envelope.step is StepName.COMPOSE)
    assert run_step(ctx, compose) is None
    assert ctx.states.load(TURN_ID) is None


def test_server_tool_runs_once_when_its_step_is_redelivered_after_redis_lost_the_state() -> None:
    key = "redelivered"
    ctx = make_context(
        FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="done")), catalog=catalog_with_counted_tool()
    )
    sent = _drive(ctx, _record_turn(ctx), until=StepName.EXECUTE_SERVER_TOOLS)
    tools_step = sent[-1].envelope
    _drive(ctx, tools_step, until=StepName.REASONER, iteration=1)
    memory_store(ctx).flush()  # the state after the tool is gone; the checkpoint is from before it
    checkpoint_next = TurnEnvelope.model_validate(ctx.turns.load_snapshot(TURN_ID)["next_envelope"])  # type: ignore[index]
    _drive(ctx, checkpoint_next)
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed"
    assert TOOL_RUNS[key] == 1


def test_message_ahead_of_a_state_whose_save_was_lost_carries_on_from_the_checkpoint_not_the_stale_state() -> None:
    key = "failover"
    llm = FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="done"))
    ctx = make_context(llm, catalog=catalog_with_counted_tool())
    store = memory_store(ctx)
    tools_step = _drive(ctx, _record_turn(ctx), until=StepName.EXECUTE_SERVER_TOOLS)[-1].envelope
    before_tools = store.load(TURN_ID)
    assert before_tools is not None
    second_call = _drive(ctx, tools_step, until=StepName.LLM_CALL, iteration=2)[-1].envelope
    # Given the saves after the tool were lost (a failover promoted a replica that holds the state before them)
    store.drop(TURN_ID)
    before_tools.version = 0
    store.save(before_tools, ttl_seconds=60)
    # When the message those saves sent arrives, it does not run on that state (it has no composed request)
    assert run_step(ctx, second_call) is None
    assert ctx.states.load(TURN_ID) is None and len(llm.requests) == 1
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "running"
    # Then the reconciler's message from the checkpoint finishes the turn, the tool not run again
    _drive(ctx, TurnEnvelope.model_validate(ctx.turns.load_snapshot(TURN_ID)["next_envelope"]))  # type: ignore[index]
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed" and row.output_text == "done"
    assert TOOL_RUNS[key] == 1 and len(llm.requests) == 2


def test_tool_started_without_an_outcome_is_not_run_again_and_the_model_is_told() -> None:
    key = "unknown-outcome"
    llm = FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="noted"))
    ctx = make_context(llm, catalog=catalog_with_counted_tool())
    sent = _drive(ctx, _record_turn(ctx), until=StepName.EXECUTE_SERVER_TOOLS)
    # Given a worker recorded the call as started and died before its outcome
    ctx.tool_runs.start(turn_id=TURN_ID, call_id="call_1", name="counted_tool", worker="dead@host", now=FIXED_NOW)
    # When the step runs again
    _drive(ctx, sent[-1].envelope)
    # Then the tool did not run, the model was told the outcome is unknown, and the trace says so
    assert TOOL_RUNS.get(key, 0) == 0
    outputs = [item for item in llm.requests[-1]["input"] if item.get("type") == "function_call_output"]
    assert "outcome of this counted_tool call is unknown" in outputs[0]["output"]
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed"
    assert any(step["kind"] == "tool_outcome_unknown" for step in row.trace)


def test_model_outage_is_retried_with_growing_delays_and_fails_llm_error_when_the_budget_is_spent() -> None:
    clock = Clock()
    llm = FakeLlm(*[LlmError("down", status_code=503, retryable=True) for _ in range(30)])
    ctx = make_context(llm, clock=clock, llm_retry_budget_seconds=40, llm_breaker_failures=100)
    sent = _drive(ctx, _record_turn(ctx), until=StepName.LLM_CALL)
    dispatch: Dispatch | None = sent[-1]
    delays = []
    while dispatch is not None and dispatch.envelope.step is StepName.LLM_CALL:
        clock.now += timedelta(seconds=dispatch.countdown)
        dispatch = run_step(ctx, dispatch.envelope)
        if dispatch is not None and dispatch.envelope.step is StepName.LLM_CALL:
            delays.append(dispatch.countdown)
    assert dispatch is not None and dispatch.envelope.step is StepName.PERSIST
    assert delays == sorted(delays) and sum(delays) <= 40
    _drive(ctx, dispatch.envelope)
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "failed" and row.error is not None
    assert row.error["code"] == "llm_error" and "APTIX_LLM_RETRY_BUDGET_SECONDS" in row.error["message"]


def test_model_answer_no_retry_can_fix_fails_the_turn_llm_error_at_once_in_the_servers_words() -> None:
    llm = FakeLlm(LlmError("LLM server answered 400: bad request", status_code=400))
    ctx = make_context(llm)
    _drive(ctx, _record_turn(ctx))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "failed" and row.error is not None
    assert row.error == {"code": "llm_error", "message": "LLM server answered 400: bad request"}
    assert len(llm.requests) == 1


def test_generation_that_failed_rate_limited_is_retried_as_a_429_and_fails_llm_rate_limited() -> None:
    # A generation that failed ``rate_limit_exceeded`` is the model's rate limit, as a 429 is (it was
    # llm_error before the one policy; the OpenAI face shows llm_rate_limited as rate_limit_exceeded).
    failed = LlmError("LLM response failed (rate_limit_exceeded)", code="rate_limit_exceeded", retryable=True)
    llm = FakeLlm(failed, failed)
    ctx = make_context(llm, llm_max_attempts=2, llm_breaker_failures=1)
    _drive(ctx, _record_turn(ctx))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "failed" and row.error is not None
    assert row.error["code"] == "llm_rate_limited" and "APTIX_LLM_MAX_ATTEMPTS=2" in row.error["message"]
    assert len(llm.requests) == 2  # and a rate limit never opened the breaker (threshold 1) between them


@pytest.mark.parametrize(
    ("errors", "settings"),
    [
        ([LlmError("LLM server answered 400: bad", status_code=400)], {}),
        ([LlmError("down", status_code=503, retryable=True)], {"llm_max_attempts": 1}),
    ],
    ids=["no retry can fix it", "budget spent"],
)
def test_turn_given_up_at_the_model_is_failed_from_its_checkpoint_when_redis_loses_the_state(
    errors: list[Exception], settings: dict[str, Any]
) -> None:
    # Given a turn whose model call was given up (at once, or once its budget was spent)
    llm = FakeLlm(*errors)
    ctx = make_context(llm, **settings)
    persist = _drive(ctx, _record_turn(ctx), until=StepName.PERSIST)[-1].envelope
    # When Redis loses everything before persist runs
    memory_store(ctx).flush()
    _drive(ctx, persist)
    # Then persist carries on from the checkpoint the give-up left: the turn fails, the model is not asked again
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "failed" and row.error is not None and row.error["code"] == "llm_error"
    assert len(llm.requests) == 1


def test_open_breaker_wait_is_no_call_and_the_turn_completes_when_the_model_returns() -> None:
    clock = Clock()
    answers: list[LlmResponse | Exception] = [LlmError("down", status_code=0, retryable=True) for _ in range(2)]
    llm = FakeLlm(*answers, LlmResponse(response_id="r", output_text="back"))
    ctx = make_context(llm, clock=clock, llm_breaker_failures=2, llm_breaker_open_seconds=5)
    dispatch: Dispatch | None = _drive(ctx, _record_turn(ctx), until=StepName.LLM_CALL)[-1]
    waits = 0
    while dispatch is not None:
        clock.now += timedelta(seconds=dispatch.countdown)
        waits += dispatch.envelope.step is StepName.LLM_CALL and dispatch.envelope.attempt > 0
        dispatch = run_step(ctx, dispatch.envelope)
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed" and row.output_text == "back"
    assert len(llm.requests) == 3 and waits >= 2


def test_step_leased_elsewhere_is_sent_again_after_half_the_lease() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), step_lease_seconds=10)
    env = _record_turn(ctx)
    memory_store(ctx).claim(Lease(TURN_ID, env.step_key, "other"), ttl_seconds=10)
    dispatch = run_step(ctx, env)
    assert dispatch is not None and dispatch.envelope.step_key == env.step_key
    assert dispatch.countdown == 5 and dispatch.envelope.attempt == 1


def test_first_message_of_an_unrecorded_turn_is_retried_then_dropped() -> None:
    ctx = make_context()
    env = TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER)
    dispatch = run_step(ctx, env)
    assert dispatch is not None and dispatch.countdown == 0.01  # the gateway's commit is usually a moment away
    assert run_step(ctx, env.model_copy(update={"attempt": 60})) is None


def test_first_message_starts_its_turn_and_a_redelivery_after_the_start_runs_it_from_its_request() -> None:
    # Given a recorded turn whose first message a worker took, started, and died with
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")))
    env = _record_turn(ctx)
    assert ctx.turns.start(TURN_ID, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=1)) is not None
    # When the message is delivered again
    sent = _drive(ctx, env)
    # Then the turn runs from its request to its end, its start's deadline pushed on the way
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed" and record.output_text == "x"
    assert sent[-1].envelope.step is StepName.PERSIST


def test_first_message_of_a_turn_that_ended_before_it_started_is_dropped_without_state() -> None:
    # Given a recorded turn cancelled while it was queued, and a Redis restarted empty since (no cancel flag)
    ctx = make_context()
    env = _record_turn(ctx)
    assert [record.turn_id for record in ctx.ending.cancel_queued([TURN_ID])] == [TURN_ID]
    ctx = with_store(ctx, MemoryStateStore())
    # When its first message arrives, nothing runs and nothing is kept for it
    assert run_step(ctx, env) is None
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "cancelled"
    assert ctx.states.load(TURN_ID) is None


def test_redelivered_step_resends_its_next_message_only_while_that_has_not_run() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")))
    env = _record_turn(ctx)
    first = run_step(ctx, env)
    assert first is not None
    assert run_step(ctx, env) == Dispatch(first.envelope)  # the next message may have been lost: resend
    run_step(ctx, first.envelope)
    assert run_step(ctx, env) is None  # it arrived and ran: nothing to resend


class _DropsAfterCommit:
    """A tool-run repository whose writes commit and then lose their answer once each (a dropped connection)."""

    def __init__(self, inner: ToolRunRepository) -> None:
        self._inner = inner
        self.dropped: set[str] = set()

    def start(self, **kwargs: Any) -> ToolRun | None:
        return self._once("start", self._inner.start(**kwargs))

    def finish(self, **kwargs: Any) -> bool:
        return self._once("finish", self._inner.finish(**kwargs))

    def _once(self, name: str, value: T) -> T:
        if name not in self.dropped:
            self.dropped.add(name)
            raise OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly"))
        return value


def test_tool_runs_once_and_its_outcome_stands_when_its_records_lose_their_answers() -> None:
    key = "dropped-answers"
    llm = FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="done"))
    base = make_context(llm, catalog=catalog_with_counted_tool())
    flaky = _DropsAfterCommit(base.tool_runs)
    ctx = replace(base, tool_runs=flaky)  # type: ignore[arg-type]  # duck-typed repository
    _drive(ctx, _record_turn(ctx))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed" and flaky.dropped == {"start", "finish"}
    assert TOOL_RUNS[key] == 1
    outputs = [item for item in llm.requests[-1]["input"] if item.get("type") == "function_call_output"]
    assert outputs[0]["output"] == f"counted {key}"
    assert base.tool_runs.for_turn(TURN_ID)["call_1"].status == "succeeded"


def test_entry_steps_run_in_one_message_and_each_is_traced_with_its_time_and_worker() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")))
    dispatch = run_step(ctx, _record_turn(ctx))
    assert dispatch is not None and dispatch.envelope.step is StepName.REASONER
    state = ctx.states.load(TURN_ID)
    assert state is not None
    fused = [(step.step, step.worker) for step in state.trace if step.kind == "layer_step"]
    assert fused == [
        ("request_handler", "unit-host"), ("session_creator", "unit-host"), ("session_context_resolver", "unit-host"),
        ("context_provider_initializer", "unit-host"),
    ]  # fmt: skip
    assert all(step.duration_ms is not None for step in state.trace if step.kind == "layer_step")
    assert state.version == 1  # one save for the whole layer


def test_with_queue_boundaries_each_task_runs_every_step_on_its_queue_and_a_plain_turn_is_three_messages() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), task_boundaries="queue")
    sent = _drive(ctx, _record_turn(ctx))
    # entry's task runs the reasoner and the composition (pipeline) and sends the model call (llm);
    # the reasoner after it runs the persistence too, and the chain ends there
    assert [(d.envelope.step, d.envelope.hop) for d in sent] == [(StepName.LLM_CALL, 6), (StepName.REASONER, 7)]
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed"
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.version == 3  # one save per message
    inline = [step.step for step in state.trace if step.kind == "layer_step"]
    assert inline == [
        "request_handler", "session_creator", "session_context_resolver", "context_provider_initializer",
        "reasoner", "compose",
    ]  # fmt: skip
    assert all(step.worker == "unit-host" for step in state.trace if step.kind == "layer_step")


def test_with_layer_boundaries_a_plain_turn_is_a_message_per_layer() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), task_boundaries="layer")
    sent = _drive(ctx, _record_turn(ctx))
    steps = [d.envelope.step for d in sent]
    assert steps == [StepName.REASONER, StepName.COMPOSE, StepName.LLM_CALL, StepName.REASONER, StepName.PERSIST]


def test_with_queue_boundaries_a_server_tool_turn_changes_task_only_where_its_queue_changes() -> None:
    key = "queue-bounds"
    ctx = make_context(FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="done")),
                       catalog=catalog_with_counted_tool(), task_boundaries="queue")  # fmt: skip
    sent = _drive(ctx, _record_turn(ctx))
    assert [d.envelope.step for d in sent] == [
        StepName.LLM_CALL, StepName.REASONER, StepName.EXECUTE_SERVER_TOOLS, StepName.REASONER, StepName.LLM_CALL,
        StepName.REASONER,
    ]  # fmt: skip
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed"
    assert TOOL_RUNS[key] == 1


def test_with_queue_boundaries_a_redelivered_message_resends_what_left_its_task_only_while_that_has_not_run() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), task_boundaries="queue")
    env = _record_turn(ctx)
    first = run_step(ctx, env)
    assert first is not None and first.envelope.step is StepName.LLM_CALL  # past the reasoner and compose, inline
    assert run_step(ctx, env) == Dispatch(first.envelope)  # the model call's message may have been lost: resend
    run_step(ctx, first.envelope)
    assert run_step(ctx, env) is None  # it arrived and ran: nothing to resend


def test_a_turn_whose_workers_change_task_boundaries_midway_runs_every_step_once() -> None:
    # Given workers on either setting (a rolling change of APTIX_TASK_BOUNDARIES), on the same stores
    llm = FakeLlm(LlmResponse(response_id="r", output_text="x"))
    by_layer = make_context(llm, task_boundaries="layer")
    by_queue = replace(
        by_layer, settings=by_layer.settings.model_copy(update={"task_boundaries": TaskBoundaries.QUEUE})
    )
    first = run_step(by_layer, _record_turn(by_layer))
    assert first is not None and first.envelope.step is StepName.REASONER
    # When a queue worker runs the reasoner (and the composition after it), and a layer worker gets it again
    model_call = run_step(by_queue, first.envelope)
    assert model_call is not None and model_call.envelope.step is StepName.LLM_CALL
    assert run_step(by_layer, first.envelope) is None  # what left that task is not its to send
    assert run_step(by_queue, first.envelope) == Dispatch(model_call.envelope)  # nor lost: a queue worker resends
    # Then the turn completes with one model call
    assert _drive(by_layer, model_call.envelope) != []
    record = by_layer.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed"
    assert len(llm.requests) == 1


def test_with_call_boundaries_a_plain_turn_is_one_message_whose_task_runs_every_step() -> None:
    llm = FakeLlm(LlmResponse(response_id="r", output_text="x"))
    ctx = make_context(llm, task_boundaries="call")
    sent = _drive(ctx, _record_turn(ctx))
    # the entry's task runs on into the model call, and after it the reasoner and the persistence
    assert sent == []
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed" and record.output_text == "x"
    state = ctx.states.load(TURN_ID)
    assert state is not None and state.version == 1  # one save, at the end: the model's answer rode it
    inline = [step.step for step in state.trace if step.kind == "layer_step"]
    assert inline[-3:] == ["compose", "llm_call", "reasoner"]  # the persistence committed the trace: none after it
    assert len(llm.requests) == 1


def test_with_call_boundaries_an_entry_that_came_on_the_pipeline_queue_sends_the_model_call() -> None:
    # Given a gateway whose APTIX_TASK_BOUNDARIES is not call: it puts the entry on the pipeline queue
    llm = FakeLlm(LlmResponse(response_id="r", output_text="x"))
    ctx = make_context(llm, task_boundaries="call")
    entry = _record_turn(ctx)
    model_call = run_step(ctx, entry, queue=Queue.PIPELINE.value)
    # Then its task (in a pool not made to wait on models) stops before the call and sends it on the model's queue
    assert model_call is not None and model_call.envelope.step is StepName.LLM_CALL and llm.requests == []
    # and a redelivery of that entry, once the call ran, finds the call's message arrived: nothing to send again
    assert run_step(ctx, model_call.envelope, queue=Queue.LLM.value) is None
    assert run_step(ctx, entry, queue=Queue.PIPELINE.value) is None
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed" and len(llm.requests) == 1


def test_a_message_reports_every_step_it_ran_and_the_step_it_sent_next() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), task_boundaries="call")
    entry, model = MessageTally(), MessageTally()
    model_call = run_step(ctx, _record_turn(ctx), tally=entry, queue=Queue.PIPELINE.value)
    assert model_call is not None
    entry_ran = ran(entry, model_call)
    assert entry_ran is not None and entry_ran.endswith("; next llm_call")
    assert re.findall(r"(\w+) \d+\.\d ms", entry_ran) == [
        "request_handler", "session_creator", "session_context_resolver", "context_provider_initializer",
        "reasoner", "compose",
    ]  # fmt: skip
    assert run_step(ctx, model_call.envelope, tally=model) is None
    assert re.fullmatch(r"ran llm_call [\d.]+ ms, reasoner [\d.]+ ms, persist [\d.]+ ms", ran(model, None) or "")
    # a redelivery of the message that ran: nothing runs, nothing to report
    again = MessageTally()
    assert run_step(ctx, model_call.envelope, tally=again) is None and ran(again, None) is None


def test_an_entry_that_runs_the_model_call_reports_every_step_and_no_next() -> None:
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), task_boundaries="call")
    tally = MessageTally()
    assert run_step(ctx, _record_turn(ctx), tally=tally, queue=Queue.LLM.value) is None
    assert re.findall(r"(\w+) \d+\.\d ms", ran(tally, None) or "") == [
        "request_handler", "session_creator", "session_context_resolver", "context_provider_initializer",
        "reasoner", "compose", "llm_call", "reasoner", "persist",
    ]  # fmt: skip


def test_with_call_boundaries_a_server_tool_turn_is_a_message_per_call() -> None:
    key = "call-bounds"
    ctx = make_context(FakeLlm(_tool_call(key), LlmResponse(response_id="r2", output_text="done")),
                       catalog=catalog_with_counted_tool(), task_boundaries="call")  # fmt: skip
    sent = _drive(ctx, _record_turn(ctx))
    # the entry's task makes the first model call; the tool and the second call are a message each
    assert [d.envelope.step for d in sent] == [StepName.EXECUTE_SERVER_TOOLS, StepName.LLM_CALL]
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed"
    assert TOOL_RUNS[key] == 1


class _CancelledDuringTheCall(FakeLlm):
    """A model whose first answer comes after the turn was cancelled (as the gateway cancels it)."""

    ctx: StepContext

    def create(self, request: dict[str, Any]) -> LlmResponse:
        if not self.requests:
            assert self.ctx.ending.end(TURN_ID, CANCELLED_BY_CLIENT) is not None
        return super().create(request)


@pytest.mark.parametrize("boundaries", list(TaskBoundaries))
def test_a_turn_cancelled_during_its_model_call_runs_no_tool_and_no_other_call(boundaries: TaskBoundaries) -> None:
    key = f"cancelled-{boundaries.value}"
    llm = _CancelledDuringTheCall(_tool_call(key), LlmResponse(response_id="r2", output_text="never"))
    ctx = make_context(llm, catalog=catalog_with_counted_tool(), task_boundaries=boundaries.value)
    llm.ctx = ctx
    entry = _record_turn(ctx)
    if boundaries is TaskBoundaries.CALL:  # the entry's task makes the call, and the tool's message finds the cancel
        assert [d.envelope.step for d in _drive(ctx, entry)] == [StepName.EXECUTE_SERVER_TOOLS]
    else:  # the model call's message ends, and the next message's begin ends the chain
        model_call = _drive(ctx, entry, until=StepName.LLM_CALL)[-1]
        assert [d.envelope.step for d in _drive(ctx, model_call.envelope)] == [StepName.REASONER]
    assert key not in TOOL_RUNS and len(llm.requests) == 1
    state = ctx.states.load(TURN_ID)
    assert state is not None and [k for k in state.steps_done if ":llm_call:" in k]  # the answer is kept
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "cancelled"


def test_a_plain_turn_cancelled_during_its_model_call_stays_cancelled_when_its_task_goes_on_to_the_commit() -> None:
    llm = _CancelledDuringTheCall(LlmResponse(response_id="r", output_text="too late"))
    ctx = make_context(llm, task_boundaries="call")
    llm.ctx = ctx
    tally = MessageTally()
    assert run_step(ctx, _record_turn(ctx), tally=tally) is None
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "cancelled" and row.output_text is None
    assert tally.committed is None  # the commit wrote nothing: the turn had ended


class _SeesTheSlots(FakeLlm):
    """A model that notes whether the calling task held a batch slot while it waited for the answer."""

    slots: BatchSlots
    held: list[bool]

    def create(self, request: dict[str, Any]) -> LlmResponse:
        self.held.append(self.slots.holding())
        return super().create(request)


@pytest.mark.parametrize(("priority", "holds"), [(BATCH_PRIORITY, True), (INTERACTIVE_PRIORITY, False)])
def test_a_batch_turns_task_runs_in_a_slot_given_up_while_it_waits_for_the_model(priority: int, holds: bool) -> None:
    llm = _SeesTheSlots(LlmResponse(response_id="r", output_text="x"))
    llm.slots, llm.held = BatchSlots(1), []
    ctx = replace(make_context(llm, task_boundaries="call"), batch_slots=llm.slots)
    holding: list[bool] = []
    first = _record_turn(ctx).model_copy(update={"priority": priority})
    original = ctx.states.begin

    def begin(*args: Any, **kwargs: Any) -> Any:
        holding.append(llm.slots.holding())
        return original(*args, **kwargs)

    ctx.states.begin = begin  # type: ignore[method-assign]
    _drive(ctx, first)
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed"
    assert holding == [holds]  # the one message's task, from its first round trip
    assert llm.held == [False]  # not while the model answered
    assert not llm.slots.holding()


class _CommitUnreachable:
    """A turn repository whose commit cannot reach the database the first ``times`` times."""

    def __init__(self, inner: Any, times: int) -> None:
        self._inner, self.left = inner, times

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.left:
            self.left -= 1
            raise OperationalError("UPDATE", {}, Exception("connection refused"))
        return self._inner.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_with_call_boundaries_a_trouble_after_the_model_call_in_its_task_does_not_ask_the_model_again() -> None:
    llm = FakeLlm(LlmResponse(response_id="r", output_text="once"))
    base = make_context(llm, task_boundaries="call")
    flaky = _CommitUnreachable(base.turns, times=1)
    ctx = replace(base, turns=flaky)  # type: ignore[arg-type]  # duck-typed repository
    entry = _record_turn(ctx)
    # Given the entry's task made the model call, and the persistence run inline after it could not reach the database
    again = run_step(ctx, entry)
    assert again is not None and again.countdown > 0 and again.envelope.step_key == entry.step_key
    # When the same message runs again, it finds the model call done and sends on the step after it
    on = run_step(ctx, again.envelope)
    assert on is not None and on.envelope.step is StepName.REASONER
    # and writes the answer's checkpoint its first run ended before: Redis may lose the state now
    checkpoint = ctx.turns.load_snapshot(TURN_ID)
    assert checkpoint is not None and checkpoint["last_response"] is not None
    assert TurnEnvelope.model_validate(checkpoint["next_envelope"]) == on.envelope
    memory_store(ctx).flush()
    _drive(ctx, on.envelope)
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status.value == "completed" and record.output_text == "once"
    assert len(llm.requests) == 1 and flaky.left == 0


class _CountedCheckpoints:
    """A turn repository that keeps the frontier (next step) of every checkpoint written."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.frontiers = inner, []

    def checkpoint(self, turn_id: str, state: dict[str, Any], **kwargs: Any) -> Any:
        self.frontiers.append(TurnEnvelope.model_validate(state["next_envelope"]).step)
        return self._inner.checkpoint(turn_id, state, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize(
    ("boundaries", "frontiers"),
    [
        # a message per layer: each answer's checkpoint carries on at the reasoner
        ("layer", [StepName.REASONER, StepName.REASONER]),
        # a message per call: the first answer's task ends at the tool, the checkpoint carries on there; the second
        # answer's task goes on to the commit, whose snapshot holds it
        ("call", [StepName.EXECUTE_SERVER_TOOLS]),
    ],
)
def test_a_model_answer_is_checkpointed_once_as_its_task_ends_unless_the_task_commits(
    boundaries: TaskBoundaries, frontiers: list[StepName]
) -> None:
    base = make_context(FakeLlm(_tool_call("once-a-task"), LlmResponse(response_id="r2", output_text="done")),
                        catalog=catalog_with_counted_tool(), task_boundaries=boundaries)  # fmt: skip
    counted = _CountedCheckpoints(base.turns)
    ctx = replace(base, turns=counted)  # type: ignore[arg-type]  # duck-typed repository
    _drive(ctx, _record_turn(ctx))
    assert counted.frontiers == frontiers
    checkpoint = ctx.turns.load_snapshot(TURN_ID)
    assert checkpoint is not None and checkpoint["status"] == "completed"
    assert sum(key.split(":")[2] == StepName.LLM_CALL.value for key in checkpoint["steps_done"]) == 2


class _SaveFails(MemoryStateStore):
    """A state store that cannot save (Redis went away)."""

    def save(self, state: Any, **_options: Any) -> None:
        raise redis.ConnectionError("Connection refused")


def test_tool_outcome_is_recorded_durably_and_the_step_writes_nothing_to_redis_after_the_tool_ran() -> None:
    key = "redis-gone"
    ctx = with_store(make_context(catalog=catalog_with_counted_tool()), _SaveFails())
    state = make_state(turn_id=TURN_ID)
    state.ledger.append(LedgerEntry(call_id="call_1", name="counted_tool", arguments=json.dumps({"key": key}),
                                    kind="server", iteration=1))  # fmt: skip
    env = TurnEnvelope(turn_id=TURN_ID, step=StepName.EXECUTE_SERVER_TOOLS, hop=6, iteration=1)
    assert execute_server_tools.run(ctx, env, state).ok  # Redis is only the driver's save's, after the step
    assert TOOL_RUNS[key] == 1
    assert ctx.tool_runs.for_turn(TURN_ID)["call_1"].status == "succeeded"


class _FinishFails:
    """A tool-run repository whose outcomes cannot be written (the database went away after the start)."""

    def __init__(self, inner: ToolRunRepository) -> None:
        self._inner = inner

    def start(self, **kwargs: Any) -> ToolRun | None:
        return self._inner.start(**kwargs)

    def finish(self, **_kwargs: Any) -> bool:
        raise OperationalError("UPDATE", {}, Exception("connection refused"))


def test_tool_outcome_is_saved_in_redis_when_its_durable_record_fails_and_the_tool_does_not_run_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("workers.retry._DROPPED_CONNECTION_PAUSES", (0.0, 0.0))
    key = "record-gone"
    base = make_context(catalog=catalog_with_counted_tool())
    ctx = replace(base, tool_runs=_FinishFails(base.tool_runs))  # type: ignore[arg-type]  # duck-typed repository
    state = make_state(turn_id=TURN_ID)
    state.ledger.append(LedgerEntry(call_id="call_1", name="counted_tool", arguments=json.dumps({"key": key}),
                                    kind="server", iteration=1))  # fmt: skip
    env = TurnEnvelope(turn_id=TURN_ID, step=StepName.EXECUTE_SERVER_TOOLS, hop=6, iteration=1)
    with pytest.raises(OperationalError):
        execute_server_tools.run(ctx, env, state)
    # the durable record says "started" only; the ledger in Redis has the outcome
    assert base.tool_runs.for_turn(TURN_ID)["call_1"].status == "started"
    saved = ctx.states.load(TURN_ID)
    assert saved is not None and [(e.status, e.output) for e in saved.ledger] == [("done", f"counted {key}")]
    # a run of the step again on that state runs no call
    assert execute_server_tools.run(base, env, saved).ok
    assert TOOL_RUNS[key] == 1
