"""The workers' metrics on in-process fakes: each event counted once, where it happens.

The driver counts a message's steps once their outcome is saved (a redelivery is not a second run,
a failed save counts nothing until the step runs again), the llm_call step counts each call by
outcome with its tokens, the reconciler its scans, re-drives and give-ups.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import fakeredis
import pytest
import urllib3

from shared.errors import LlmError, StateConflict
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo
from shared.state import MemoryStateStore
from shared.state.keys import RECONCILER_LEADER_KEY
from shared.state.leader import LeaderLease
from shared.step_sender import StepSender
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    TURN_ID,
    Clock,
    FakeBroker,
    FakeLlm,
    drive,
    make_context,
    record_turn,
    with_store,
)
from workers.context import StepContext
from workers.driver import fail_turn, run_step
from workers.llm.types import FunctionCall, LlmResponse
from workers.metrics import model_outcome
from workers.reconciler import Reconciler

ENTRY_STEPS = ("request_handler", "session_creator", "session_context_resolver", "context_provider_initializer")
OPEN_FILE = {"type": "function", "name": "open_file", "description": "Open a file.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}  # fmt: skip


def _value(ctx: StepContext, name: str, **labels: str) -> float:
    return ctx.metrics.registry.get_sample_value(name, labels) or 0.0


def _steps(ctx: StepContext) -> dict[str, float]:
    """How often each step was counted as run."""
    counts = {
        step.value: _value(ctx, "aptix_step_seconds_count", layer=_layer(step), step=step.value) for step in StepName
    }
    return {step: count for step, count in counts.items() if count}


def _layer(step: StepName) -> str:
    from shared.task_names import LAYER_OF

    return LAYER_OF[step].value


def _answer(text: str = "hi") -> LlmResponse:
    return LlmResponse(response_id="r", output_text=text, input_tokens=7, output_tokens=3)


def test_a_completed_turn_counts_each_step_once_its_model_call_its_tokens_and_the_turn() -> None:
    ctx = make_context(FakeLlm(_answer()))

    drive(ctx, record_turn(ctx))

    assert _steps(ctx) == {**dict.fromkeys(ENTRY_STEPS, 1), "reasoner": 2, "compose": 1, "llm_call": 1, "persist": 1}
    assert _value(ctx, "aptix_turns_finished_total", status="completed", code="") == 1
    assert _value(ctx, "aptix_model_call_seconds_count", model="gpt-4.1-mini", outcome="ok") == 1
    assert _value(ctx, "aptix_model_tokens_total", model="gpt-4.1-mini", kind="input") == 7
    assert _value(ctx, "aptix_model_tokens_total", model="gpt-4.1-mini", kind="output") == 3
    assert _value(ctx, "aptix_turns_paused_total") == 0


def test_a_redelivered_message_is_counted_as_a_redelivery_not_as_a_second_run() -> None:
    ctx = make_context(FakeLlm(_answer()))
    first = record_turn(ctx)
    run_step(ctx, first)

    again = run_step(ctx, first)

    assert again is not None and again.envelope.step is StepName.REASONER
    assert _value(ctx, "aptix_steps_redelivered_total", step="request_handler") == 1
    assert _steps(ctx) == dict.fromkeys(ENTRY_STEPS, 1)


class _FirstSaveConflicts(MemoryStateStore):
    """Loses the race of its first save (a duplicate delivery saved first)."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 1

    def save(self, state: Any, **kwargs: Any) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise StateConflict("another delivery saved first")
        super().save(state, **kwargs)


def test_steps_whose_save_failed_are_counted_only_when_they_run_again() -> None:
    ctx = with_store(make_context(FakeLlm(_answer())), _FirstSaveConflicts())
    env = record_turn(ctx)

    later = run_step(ctx, env)

    assert later is not None and later.countdown > 0
    assert _steps(ctx) == {}
    assert _value(ctx, "aptix_step_retries_total", reason="infrastructure", step="request_handler") == 1
    run_step(ctx, later.envelope)
    assert _steps(ctx) == dict.fromkeys(ENTRY_STEPS, 1)


def test_a_model_that_keeps_failing_counts_each_call_the_retry_and_the_turn_failed_by_code() -> None:
    failing = [LlmError("server error", status_code=500, retryable=True) for _ in range(2)]
    ctx = make_context(FakeLlm(*failing), llm_max_attempts=2)

    drive(ctx, record_turn(ctx))

    assert _value(ctx, "aptix_model_call_seconds_count", model="gpt-4.1-mini", outcome="5xx") == 2
    assert _value(ctx, "aptix_step_retries_total", reason="model", step="llm_call") == 1
    assert _value(ctx, "aptix_turns_finished_total", status="failed", code="llm_error") == 1
    assert _steps(ctx)["llm_call"] == 2
    assert _value(ctx, "aptix_model_tokens_total", model="gpt-4.1-mini", kind="input") == 0


def test_a_pause_for_client_tools_is_counted_as_a_pause_not_as_an_end() -> None:
    call = FunctionCall(call_id="call_1", name="open_file", arguments=json.dumps({"path": "a"}))
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text=None, function_calls=(call,))))

    drive(ctx, record_turn(ctx, tools=[OPEN_FILE]))

    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value
    assert _value(ctx, "aptix_turns_paused_total") == 1
    assert _value(ctx, "aptix_turns_finished_total", status="completed", code="") == 0


def test_a_commit_that_finds_the_turn_cancelled_counts_nothing() -> None:
    ctx = make_context(FakeLlm(_answer()))
    sent = drive(ctx, record_turn(ctx), until=StepName.PERSIST)
    cancel = ErrorInfo(code=ErrorCode.CANCELLED, message="cancelled by the client")
    assert ctx.turns.finish_early(TURN_ID, status=TurnStatus.CANCELLED, error=cancel, now=FIXED_NOW) is not None

    run_step(ctx, sent[-1].envelope)

    assert _steps(ctx)["persist"] == 1
    assert _value(ctx, "aptix_turns_finished_total", status="completed", code="") == 0


def test_a_turn_failed_outside_any_step_is_counted_once() -> None:
    ctx = make_context()
    record_turn(ctx)

    fail_turn(ctx, TURN_ID, "the pipeline could not run this turn")
    fail_turn(ctx, TURN_ID, "the pipeline could not run this turn")

    assert _value(ctx, "aptix_turns_finished_total", status="failed", code="internal_error") == 1


def test_the_reconciler_counts_its_scans_its_re_drives_by_source_and_the_turn_it_gives_up() -> None:
    clock = Clock()
    ctx = make_context(clock=clock, reconciler_max_redrives=2)
    record_turn(ctx)
    reconciler = Reconciler(
        settings=ctx.settings, turns=ctx.turns, states=ctx.states, in_flight=ctx.in_flight,
        steps=StepSender(FakeBroker(), timers=ctx.timers, park_after=30),
        leader=LeaderLease(fakeredis.FakeRedis(), key=RECONCILER_LEADER_KEY, owner="unit"), ending=ctx.ending,
        clock=clock, metrics=ctx.metrics,
    )  # fmt: skip

    for scan in range(1, 5):
        clock.now = FIXED_NOW + timedelta(seconds=100 * scan)
        ctx.in_flight.forget(TURN_ID)  # every re-driven message is lost too
        reconciler.scan()

    assert _value(ctx, "aptix_reconciler_scans_total") == 4
    assert _value(ctx, "aptix_reconciler_redrives_total", source="start") == 2
    assert _value(ctx, "aptix_turns_finished_total", status="failed", code="internal_error") == 1


def test_series_known_in_advance_exist_at_zero_before_their_first_event() -> None:
    ctx = make_context()

    for name, labels in [
        ("aptix_turns_finished_total", {"status": "completed", "code": ""}),
        ("aptix_turns_finished_total", {"status": "failed", "code": "llm_error"}),
        ("aptix_step_retries_total", {"reason": "model", "step": "llm_call"}),
        ("aptix_steps_redelivered_total", {"step": "persist"}),
        ("aptix_reconciler_redrives_total", {"source": "checkpoint"}),
        ("aptix_turns_paused_total", {}),
    ]:
        assert ctx.metrics.registry.get_sample_value(name, labels) == 0, (name, labels)


def _caused(error: LlmError, cause: Exception) -> LlmError:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "ok"),
        (_caused(LlmError("t", retryable=True), urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out")),
         "timeout"),
        (_caused(LlmError("c", retryable=True), urllib3.exceptions.NewConnectionError(None, "refused")),
         "connection_error"),
        (LlmError("r", status_code=429, retryable=True), "429"),
        (LlmError("s", status_code=503, retryable=True), "5xx"),
        (LlmError("b", status_code=400), "4xx"),
        (LlmError("not JSON", status_code=200), "bad_response"),
        (LlmError("response failed", code="server_error", retryable=True), "bad_response"),
    ],
)  # fmt: skip
def test_model_outcome_names_what_a_call_ended_with(error: LlmError | None, outcome: str) -> None:
    assert model_outcome(error) == outcome
