"""Unit tests of the composition, LLM call and reasoner steps, on in-process fakes."""

from __future__ import annotations

import pytest

from shared.errors import LlmError
from shared.models.envelope import TurnEnvelope
from shared.models.turn import ClientTool, TurnStatus
from shared.result import ErrorCode
from shared.task_names import StepName
from tests.unit.fakes import FakeLlm, make_context, make_state
from workers.llm.types import FunctionCall, LlmResponse, response_to_dict
from workers.next_step import Continue, RetryAfter
from workers.retry import Trouble
from workers.steps import compose, llm_call, reasoner


def _env(step: StepName, iteration: int = 1, attempt: int = 0) -> TurnEnvelope:
    return TurnEnvelope(turn_id="turn_" + "0" * 32, step=step, iteration=iteration, attempt=attempt)


def test_compose_offers_mode_tools_change_mode_and_client_tools_when_composing() -> None:
    ctx = make_context()
    state = make_state(client_tools=[ClientTool(name="open_file", description="Open a file.")])
    request = compose.compose_request(ctx, state)
    assert [tool["name"] for tool in request["tools"]] == ["get_current_time", "agent_change_mode", "open_file"]
    assert all("strict" in tool and "parameters" in tool for tool in request["tools"])
    assert request["store"] is False
    assert request["model"] == ctx.settings.llm_model


def test_compose_emits_turn_context_as_a_developer_message_when_armed() -> None:
    ctx = make_context()
    state = make_state()
    state.providers.turn_context = ["Welcome!"]
    result = compose.run(ctx, _env(StepName.COMPOSE), state)
    assert result.unwrap() == Continue(StepName.LLM_CALL, 1)
    assert state.pending_request is not None
    assert {"type": "message", "role": "developer", "content": "Welcome!"} in state.pending_request["input"]
    assert state.providers.turn_context_emitted


def test_reasoner_clears_turn_context_after_it_was_emitted() -> None:
    ctx = make_context()
    state = make_state()
    state.providers.turn_context = ["Welcome!"]
    state.providers.turn_context_emitted = True
    state.last_response = response_to_dict(LlmResponse(response_id="r", output_text="hi"))
    result = reasoner.run(ctx, _env(StepName.REASONER), state)
    assert result.unwrap() == Continue(StepName.PERSIST)
    assert state.providers.turn_context == []
    assert state.status is TurnStatus.COMPLETED and state.exit_mode == 1
    assert state.output_text == "hi"
    assert [step.kind for step in state.trace] == ["turn_context_cleared", "exit"]


def test_reasoner_fails_iteration_limit_when_calls_are_used_up() -> None:
    ctx = make_context(max_iterations=2)
    state = make_state()
    state.usage.llm_calls = 2
    result = reasoner.run(ctx, _env(StepName.REASONER, iteration=2), state)
    assert not result.ok and result.error is not None
    assert result.error.code is ErrorCode.ITERATION_LIMIT


def test_reasoner_fails_unknown_tool_when_the_model_calls_an_undeclared_tool() -> None:
    ctx = make_context()
    state = make_state()
    call = FunctionCall(call_id="c1", name="delete_everything", arguments="{}")
    state.last_response = response_to_dict(LlmResponse(response_id="r", output_text=None, function_calls=(call,)))
    result = reasoner.run(ctx, _env(StepName.REASONER), state)
    assert result.error is not None and result.error.code is ErrorCode.UNKNOWN_TOOL
    assert "delete_everything" in result.error.message


def test_llm_call_asks_to_retry_with_the_servers_delay_when_rate_limited() -> None:
    llm = FakeLlm(LlmError("slow down", status_code=429, retryable=True, retry_after=1.5))
    ctx = make_context(llm)
    state = make_state(pending_request={"model": "m", "input": []})
    result = llm_call.run(ctx, _env(StepName.LLM_CALL), state)
    later = result.unwrap()
    assert later == RetryAfter(Trouble.MODEL_RATE_LIMITED, "slow down", hint=1.5)
    assert state.usage.llm_calls == 0


def test_llm_call_makes_no_call_while_the_models_breaker_is_open() -> None:
    llm = FakeLlm(*[LlmError("down", status_code=503, retryable=True) for _ in range(3)])
    ctx = make_context(llm, llm_breaker_failures=3)
    for _ in range(3):
        llm_call.run(ctx, _env(StepName.LLM_CALL), make_state(pending_request={"model": "m", "input": []}))
    result = llm_call.run(ctx, _env(StepName.LLM_CALL), make_state(pending_request={"model": "m", "input": []}))
    later = result.unwrap()
    assert isinstance(later, RetryAfter) and later.trouble is Trouble.MODEL_BREAKER_OPEN
    assert later.hint is not None and later.hint > 0 and len(llm.requests) == 3


def test_llm_call_reports_an_answer_no_retry_can_fix_as_rejected() -> None:
    llm = FakeLlm(LlmError("LLM server answered 400: bad", status_code=400))
    ctx = make_context(llm)
    state = make_state(pending_request={"model": "m", "input": []})
    result = llm_call.run(ctx, _env(StepName.LLM_CALL), state)
    assert result.unwrap() == RetryAfter(Trouble.MODEL_REJECTED, "LLM server answered 400: bad")


@pytest.mark.parametrize(
    ("error", "opens"),
    [
        (LlmError("down", status_code=503, retryable=True), True),
        (LlmError("no answer", retryable=True), True),  # timeout, connection error, broken stream
        (LlmError("timed out", status_code=408, retryable=True), True),
        (LlmError("failed", code="server_error", retryable=True), True),
        (LlmError("slow down", status_code=429, retryable=True), False),
        (LlmError("failed", code="rate_limit_exceeded", retryable=True), False),
        (LlmError("incomplete", code="incomplete"), False),  # an answer about this request, not the model's health
        (LlmError("not JSON"), False),
        (LlmError("bad", status_code=400), False),
    ],
)
def test_llm_call_counts_only_a_down_model_against_its_breaker(error: LlmError, opens: bool) -> None:
    llm = FakeLlm(error, LlmResponse(response_id="r", output_text="hi"))
    ctx = make_context(llm, llm_breaker_failures=1)
    llm_call.run(ctx, _env(StepName.LLM_CALL), make_state(pending_request={"model": "m", "input": []}))
    result = llm_call.run(ctx, _env(StepName.LLM_CALL), make_state(pending_request={"model": "m", "input": []}))
    blocked = isinstance(result.value, RetryAfter) and result.value.trouble is Trouble.MODEL_BREAKER_OPEN
    assert blocked is opens and len(llm.requests) == (1 if opens else 2)


def test_llm_call_records_usage_and_trace_when_the_model_answers() -> None:
    llm = FakeLlm(LlmResponse(response_id="r", output_text="hi", input_tokens=7, output_tokens=3))
    ctx = make_context(llm)
    state = make_state(pending_request={"model": "m", "input": [], "tools": [{"name": "t"}]})
    result = llm_call.run(ctx, _env(StepName.LLM_CALL), state)
    assert result.unwrap() == Continue(StepName.REASONER, 1)
    assert (state.usage.llm_calls, state.usage.input_tokens, state.usage.output_tokens) == (1, 7, 3)
    assert state.trace[-1].kind == "llm_call" and state.trace[-1].data["tools_offered"] == ["t"]
    assert state.pending_request is None and state.last_response is not None
