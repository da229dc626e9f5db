"""Composition (AGN-027 layer B): builds the Responses API request for the next LLM call.

Reads: the in-flight mode (its prompt layer and server tools), the client's tools, the context
providers, the conversation history, this turn's transcript and its extras (instructions, model,
model options: ``shared.openai.TurnExtras``). Writes: ``state.pending_request`` and marks the turn
context as emitted. Next: llm_call. Fails with: nothing.

A turn's own ``instructions`` come after the mode's prompt layer and the session context; its
``model`` wins over the mode's and ``APTIX_LLM_MODEL``; its ``model_options`` are copied into the
request but never replace what composition owns (:data:`PROTECTED_KEYS`). A turn without extras gets
the request it always got.

The tool list is composed for every call from the in-flight mode. AGN-011 §4.4 fixes it for the
whole turn; AGN-031 §8, approved later, applies a mode change to the next LLM call. We follow
AGN-031 (seeds/README.md, rule 1): after ``agent_change_mode`` succeeds, the next call of the same
turn carries the new mode's prompt layer and tools.
"""

from __future__ import annotations

import copy
from typing import Any

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["PROTECTED_KEYS", "compose_request", "run"]

PROTECTED_KEYS = frozenset({"model", "input", "instructions", "tools", "store", "stream"})
"""Request fields a turn's ``model_options`` may not set: composition (and ``llm_call``, for ``stream``) owns them."""


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Compose the request of LLM call ``env.iteration``."""
    state.pending_request = compose_request(ctx, state)
    state.providers.turn_context_emitted = bool(state.providers.turn_context)
    if state.providers.turn_context_emitted:
        trace(ctx, state, env, "welcome_emitted", mode=state.mode, items=len(state.providers.turn_context))
    return success(Continue(StepName.LLM_CALL, env.iteration))


def compose_request(ctx: StepContext, state: TurnState) -> dict[str, Any]:
    """The request body: model, instructions, input items, tools, ``store: false``, then the turn's model options.

    Args:
        ctx: the mode catalog, the tool registry and the configured model.
        state: the turn: its mode, client tools, providers, history, transcript and extras.

    Returns:
        The Responses API request body of the turn's next model call.
    """
    mode = ctx.catalog.get_or_default(state.mode)
    layers = (mode.instructions, *state.providers.session_context, state.instructions)
    instructions = "\n\n".join(part for part in layers if part)
    turn_context = [{"type": "message", "role": "developer", "content": text} for text in state.providers.turn_context]
    tools = [tool.schema() for tool in ctx.tools.for_mode(mode)]
    tools += [tool.model_dump(exclude_none=True) for tool in state.client_tools]
    request: dict[str, Any] = {
        "model": state.model or mode.model or ctx.settings.llm_model,
        "instructions": instructions,
        "input": [*state.history, *turn_context, *state.transcript],
        "tools": tools,
        "store": False,
    }
    for key, value in state.model_options.items():
        if key not in PROTECTED_KEYS:
            request[key] = copy.deepcopy(value)
    return request
