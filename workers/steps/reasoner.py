"""AgentReasoner (AGN-031): the turn loop. Only it re-enters earlier layers.

Reads: the last LLM response, the tool ledger, the ToolResults provider on re-entry, the iteration
count. Writes: clears the turn-scoped context after it was emitted (its only provider mutation);
ledger entries for the calls the model made; replayed output items and client tool outputs into
the transcript; the turn's outcome and exit mode; trace steps for context clearing, re-entry
verification and the exit. Next: compose (another LLM call), execute_server_tools, persist
(:class:`~shared.models.trace.ExitMode` 1 or 2, or a failure). Fails with: ``iteration_limit``,
``unknown_tool``, ``continuation_mismatch``.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from shared.models.envelope import TurnEnvelope
from shared.models.trace import ExitMode
from shared.models.turn import PendingToolCall, TurnStatus
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.llm.parsing import replay_items
from workers.llm.types import LlmResponse, response_from_dict
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Decide the turn's next move."""
    if state.last_response is not None:
        response = response_from_dict(state.last_response)
        state.last_response = None
        _clear_turn_context(ctx, env, state)
        if response.function_calls:
            return _on_function_calls(ctx, env, state, response)
        return _complete(ctx, env, state, response)
    if state.continuation:
        return _verify_continuation(ctx, env, state)
    if _pending_client_calls(state):
        return _await_client_tools(ctx, env, state)
    return _next_llm_call(ctx, state)


def _next_llm_call(ctx: StepContext, state: TurnState) -> InvokeResult[Next]:
    iteration = state.usage.llm_calls + 1
    if iteration > ctx.settings.max_iterations:
        return failure(
            ErrorCode.ITERATION_LIMIT,
            f"the turn needed more than {ctx.settings.max_iterations} LLM calls (APTIX_MAX_ITERATIONS)",
        )
    return success(Continue(StepName.COMPOSE, iteration))


def _clear_turn_context(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> None:
    if not state.providers.turn_context_emitted:
        return
    trace(ctx, state, env, "turn_context_cleared", items=len(state.providers.turn_context))
    state.providers.turn_context = []
    state.providers.turn_context_emitted = False


def _complete(ctx: StepContext, env: TurnEnvelope, state: TurnState, response: LlmResponse) -> InvokeResult[Next]:
    state.output_text = response.output_text or ""
    state.status = TurnStatus.COMPLETED
    state.pending_tool_calls = []
    state.exit_mode = ExitMode.COMPLETED
    trace(ctx, state, env, "exit", exit_mode=ExitMode.COMPLETED.value, mode=state.mode)
    return success(Continue(StepName.PERSIST))


def _on_function_calls(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, response: LlmResponse
) -> InvokeResult[Next]:
    client_names = {tool.name for tool in state.client_tools}
    for call in response.function_calls:
        if ctx.tools.get(call.name) is None and call.name not in client_names:
            return failure(
                ErrorCode.UNKNOWN_TOOL,
                f"the model called {call.name!r}, which is neither a server tool nor a client tool of this turn",
            )
    state.transcript.extend(replay_items(response))
    for call in response.function_calls:
        kind: Literal["server", "client"] = "server" if ctx.tools.get(call.name) is not None else "client"
        state.ledger.append(
            LedgerEntry(
                call_id=call.call_id, name=call.name, arguments=call.arguments, kind=kind, iteration=env.iteration
            )
        )
    if any(entry.kind == "server" and entry.status == "pending" for entry in state.ledger):
        return success(Continue(StepName.EXECUTE_SERVER_TOOLS, env.iteration))
    return _await_client_tools(ctx, env, state)


def _pending_client_calls(state: TurnState) -> list[LedgerEntry]:
    return [entry for entry in state.ledger if entry.kind == "client" and entry.status == "pending"]


def _await_client_tools(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    pending = _pending_client_calls(state)
    state.status = TurnStatus.REQUIRES_CLIENT_TOOLS
    state.pending_tool_calls = [
        PendingToolCall(call_id=entry.call_id, name=entry.name, arguments=entry.arguments) for entry in pending
    ]
    state.exit_mode = ExitMode.AWAITING_CLIENT_TOOLS
    trace(
        ctx,
        state,
        env,
        "exit",
        exit_mode=ExitMode.AWAITING_CLIENT_TOOLS.value,
        mode=state.mode,
        pending=[entry.call_id for entry in pending],
    )
    return success(Continue(StepName.PERSIST))


def _verify_continuation(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    expected = {entry.call_id: entry for entry in _pending_client_calls(state)}
    known = {entry.call_id for entry in state.ledger}
    posted = [result["call_id"] for result in state.providers.client_results]
    counts = Counter(posted)
    missing = [call_id for call_id in expected if call_id not in counts]
    unknown = sorted({call_id for call_id in posted if call_id not in known})
    extra = sorted({c for c in posted if c in known and (c not in expected or counts[c] > 1)})
    ok = not (missing or unknown or extra)
    trace(ctx, state, env, "reentry_verification", ok=ok, missing=missing, extra=extra, unknown=unknown)
    state.continuation = False
    if not ok:
        state.providers.client_results = []
        return failure(ErrorCode.CONTINUATION_MISMATCH, _mismatch_message(missing, extra, unknown))
    outputs = {result["call_id"]: result["output"] for result in state.providers.client_results}
    for call_id, entry in expected.items():
        entry.status = "done"
        entry.output = outputs[call_id]
        state.transcript.append({"type": "function_call_output", "call_id": call_id, "output": outputs[call_id]})
    state.providers.client_results = []
    state.pending_tool_calls = []
    state.status = TurnStatus.RUNNING
    return _next_llm_call(ctx, state)


def _mismatch_message(missing: list[str], extra: list[str], unknown: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing results for {missing}")
    if extra:
        parts.append(f"results that were not expected (already answered or repeated) for {extra}")
    if unknown:
        parts.append(f"results for unknown call ids {unknown}")
    return "the tool results do not match the pending client tool calls: " + "; ".join(parts)
