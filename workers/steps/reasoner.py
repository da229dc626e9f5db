"""AgentReasoner (AGN-031): the turn loop. Only it re-enters earlier layers.

Reads: the last LLM response, the iteration count, the providers. Writes: clears the turn-scoped
context after it was emitted (its only provider mutation), the turn's outcome (``output_text``,
status, exit mode) and trace steps for context clearing and the exit. Next: compose (another LLM
call), persist (exit 1, or a failure). Fails with: ``iteration_limit``, ``unknown_tool``.
"""

from __future__ import annotations

from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.llm.types import LlmResponse, response_from_dict
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Decide the turn's next move."""
    if state.last_response is None:
        return _next_llm_call(ctx, state)
    response = response_from_dict(state.last_response)
    state.last_response = None
    _clear_turn_context(ctx, env, state)
    if response.function_calls:
        return _on_function_calls(ctx, env, state, response)
    return _complete(ctx, env, state, response)


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
    state.exit_mode = 1
    trace(ctx, state, env, "exit", exit_mode=1, mode=state.mode)
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
    # Server-tool execution and the client-tool pause arrive with the tool loop (the next issue).
    return failure(ErrorCode.INTERNAL_ERROR, "tool calls are not executed by this version")
