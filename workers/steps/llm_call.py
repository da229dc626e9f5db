"""LLM Call (AGN-027 layer C): exactly one call to the model, normalised.

Reads: ``state.pending_request``. Writes: ``state.last_response``, usage, the ``llm_call`` trace
step. Next: reasoner; RetryAfter on a 429/5xx/transport error while attempts remain (the task is
re-sent with a countdown, so no worker slot waits). Fails with: ``llm_rate_limited`` (429 after
the last attempt), ``llm_error`` (any other error).
"""

from __future__ import annotations

import time

from shared.errors import LlmError
from shared.models.envelope import TurnEnvelope
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.llm.types import response_to_dict
from workers.next_step import Continue, Next, RetryAfter
from workers.trace import trace

__all__ = ["backoff_seconds", "run"]

_MAX_RETRY_AFTER_SECONDS = 120.0


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Send the composed request and record the response."""
    request = state.pending_request
    if request is None:
        return failure(ErrorCode.INTERNAL_ERROR, f"llm_call {env.iteration} found no composed request")
    started = time.perf_counter()
    try:
        response = ctx.llm.create(request)
    except LlmError as exc:
        return _on_error(ctx, env, state, exc)
    duration_ms = (time.perf_counter() - started) * 1000
    state.last_response = response_to_dict(response)
    state.pending_request = None
    state.usage.llm_calls += 1
    state.usage.input_tokens += response.input_tokens
    state.usage.output_tokens += response.output_tokens
    trace(
        ctx,
        state,
        env,
        "llm_call",
        duration_ms=duration_ms,
        mode=state.mode,
        model=request.get("model"),
        tools_offered=[tool.get("name") for tool in request.get("tools", [])],
        input_tokens=response.input_tokens,
        output_tokens=response.output_tokens,
        function_calls=[call.name for call in response.function_calls],
    )
    return success(Continue(StepName.REASONER, env.iteration))


def backoff_seconds(attempt: int, retry_after: float | None) -> float:
    """The wait before attempt ``attempt + 1``: the server's Retry-After, else 0.5 s·2ⁿ capped at 8 s."""
    if retry_after is not None:
        return max(0.0, retry_after)
    return float(min(0.5 * 2**attempt, 8.0))


def _on_error(ctx: StepContext, env: TurnEnvelope, state: TurnState, exc: LlmError) -> InvokeResult[Next]:
    rate_limited = exc.status_code == 429 and exc.retryable
    wait = backoff_seconds(env.attempt, exc.retry_after)
    attempts_left = env.attempt + 1 < ctx.settings.llm_max_attempts
    trace(ctx, state, env, "llm_error", status=exc.status_code, code=exc.code, retryable=exc.retryable)
    if exc.retryable and attempts_left and wait <= _MAX_RETRY_AFTER_SECONDS:
        return success(RetryAfter(wait, exc.message))
    code = ErrorCode.LLM_RATE_LIMITED if rate_limited else ErrorCode.LLM_ERROR
    return failure(code, exc.message)
