"""LLM Call (AGN-027 layer C): exactly one call to the model, normalised.

Reads: ``state.pending_request``, ``state.stream``; the model's shared rate limits and circuit
breaker. Writes: ``state.last_response``, usage, the ``llm_call`` trace step (``llm_error`` for a
failed call); the breaker's count; the rate limiter's charge (settled with the answer's usage; a
429's Retry-After pauses the model for every worker); the call's latency, outcome and tokens in the
worker's metrics, as it returns; for a turn that streams, the model's text to the turn's event log
while it is generated (:mod:`workers.text_relay`: ``output_text.delta``, and ``output_text.reset``
when a call fails after some of its text went out). The recorded response is the same either way.
Next: reasoner. When the call cannot be made or answered now it returns RetryAfter naming what
happened (:class:`workers.retry.Trouble`: held back by the model's rate limits, a pause, an open
breaker, a 429, 5xx, timeout or connection error, an answer no retry can fix) and the retry policy
decides the rest: when the step runs again (holding no worker slot meanwhile), against which budget
(``APTIX_LLM_RETRY_BUDGET_SECONDS``, ``APTIX_LLM_MAX_ATTEMPTS``), and what the turn fails with once it
is spent. Fails with: ``llm_rate_limited`` / ``llm_error`` (through that policy).
The driver keeps the answer: in Redis with the task's last save (at once when a later step of the task
meets trouble), and in the database before the task ends (the turn's commit, when the task goes on to
it): the model's answer is not asked twice because a step after it failed, or a worker died or Redis
lost it after that.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

from shared.errors import LlmError
from shared.models.envelope import TurnEnvelope
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import BreakerPort, LimiterPort, StepContext
from workers.llm.limiter import Slot
from workers.llm.types import response_to_dict
from workers.next_step import Continue, Next, RetryAfter
from workers.retry import MODEL_DOWN, Trouble, model_trouble
from workers.text_relay import TextRelay
from workers.trace import trace

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Send the composed request and record the response."""
    request = state.pending_request
    if request is None:
        return failure(ErrorCode.INTERNAL_ERROR, f"llm_call {env.iteration} found no composed request")
    model = str(request.get("model") or ctx.settings.llm_model)
    limiter, breaker = ctx.limiter(model), ctx.breaker(model)
    slot = limiter.pace(request, breaker, at=ctx.clock().timestamp())  # the limits, then the breaker: one round trip
    if slot.wait > 0:
        return _held_back(ctx, state, model, slot)
    if slot.breaker_wait > 0:  # nothing was charged
        wait = slot.breaker_wait
        logger.info("turn %s: the model's circuit breaker is open; trying again in %.1fs", state.turn_id, wait)
        ctx.metrics.count_breaker_open(model)
        message = "the model did not answer: its circuit breaker stayed open (every recent call failed)"
        return success(RetryAfter(Trouble.MODEL_BREAKER_OPEN, message, hint=wait))
    relay = TextRelay(ctx.events, state.turn_id, flush_seconds=ctx.settings.llm_stream_flush_ms / 1000)
    started = time.perf_counter()
    waiting = nullcontext() if ctx.batch_slots is None else ctx.batch_slots.released()  # others' CPU meanwhile
    try:
        with waiting:
            response = (
                ctx.llm.stream(request, relay, on_text_done=relay.flush) if state.stream else ctx.llm.create(request)
            )
    except LlmError as exc:
        relay.withdraw()
        ctx.metrics.count_model_call(model, seconds=time.perf_counter() - started, error=exc)
        _settle_error(limiter, slot, exc)
        return _on_error(ctx, env, state, exc, breaker)
    except Exception:
        relay.withdraw()  # the step fails or runs again: its text so far is not the answer
        raise
    relay.finish()
    seconds = time.perf_counter() - started
    used = response.input_tokens + response.output_tokens
    limiter.settle(slot, used=used or slot.tokens)  # an answer without usage: the estimate stands
    ctx.metrics.count_model_call(
        model, seconds=seconds, input_tokens=response.input_tokens, output_tokens=response.output_tokens
    )
    if not slot.breaker_clean:  # a clean breaker has nothing to forget: no round trip
        breaker.record_success(ctx.clock().timestamp())
    duration_ms = seconds * 1000
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


def _on_error(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, exc: LlmError, breaker: BreakerPort
) -> InvokeResult[Next]:
    trouble = model_trouble(exc)
    if trouble in MODEL_DOWN:
        breaker.record_failure(ctx.clock().timestamp())
    trace(ctx, state, env, "llm_error", status=exc.status_code, code=exc.code, retryable=exc.retryable)
    return success(RetryAfter(trouble, exc.message, hint=exc.retry_after))


def _held_back(ctx: StepContext, state: TurnState, model: str, slot: Slot) -> InvokeResult[Next]:
    """The call may not go now: a paused model waits like a 429, a rate limit's slot is no failure."""
    reason = slot.reason or "paused"
    ctx.metrics.count_rate_limited(model, reason)
    logger.info("turn %s: model %s held back (%s); trying again in %.2fs", state.turn_id, model, reason, slot.wait)
    if reason == "paused":
        message = "the model did not answer: it asked every caller to wait (429 with Retry-After)"
        return success(RetryAfter(Trouble.MODEL_PAUSED, message, hint=slot.wait))
    message = f"the model's shared rate limit ({reason} per minute) held the call back"
    return success(RetryAfter(Trouble.MODEL_PACED, message, hint=slot.wait))


def _settle_error(limiter: LimiterPort, slot: Slot, exc: LlmError) -> None:
    """An error answer used no tokens; a 429 with Retry-After pauses the model for every worker.

    A call that got no answer (timeout, connection error) keeps its reservation: the model may have run it.
    """
    if exc.status_code == 429 and exc.retry_after:
        limiter.pause(exc.retry_after)
    if exc.status_code:
        limiter.settle(slot, used=0)
