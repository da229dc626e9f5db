"""Composition (AGN-027 layer B): builds the Responses API request for the next LLM call.

Reads: the in-flight mode (its prompt layer and server tools), the client's tools, the context
providers, the conversation history and this turn's transcript. Writes: ``state.pending_request``
and marks the turn context as emitted. Next: llm_call. Fails with: nothing.

The tool list is composed for every call from the in-flight mode. AGN-011 §4.4 fixes it for the
whole turn; AGN-031 §8, approved later, applies a mode change to the next LLM call. We follow
AGN-031 (seeds/README.md, rule 1): after ``agent_change_mode`` succeeds, the next call of the same
turn carries the new mode's prompt layer and tools.
"""

from __future__ import annotations

from typing import Any

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["compose_request", "run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Compose the request of LLM call ``env.iteration``."""
    state.pending_request = compose_request(ctx, state)
    state.providers.turn_context_emitted = bool(state.providers.turn_context)
    if state.providers.turn_context_emitted:
        trace(ctx, state, env, "welcome_emitted", mode=state.mode, items=len(state.providers.turn_context))
    return success(Continue(StepName.LLM_CALL, env.iteration))


def compose_request(ctx: StepContext, state: TurnState) -> dict[str, Any]:
    """The request body: model, instructions, input items, tools, ``store: false``."""
    mode = ctx.catalog.get_or_default(state.mode)
    instructions = "\n\n".join(part for part in (mode.instructions, *state.providers.session_context) if part)
    turn_context = [{"type": "message", "role": "developer", "content": text} for text in state.providers.turn_context]
    tools = [tool.schema() for tool in ctx.tools.for_mode(mode)]
    tools += [tool.model_dump(exclude_none=True) for tool in state.client_tools]
    return {
        "model": mode.model or ctx.settings.llm_model,
        "instructions": instructions,
        "input": [*state.history, *turn_context, *state.transcript],
        "tools": tools,
        "store": False,
    }
