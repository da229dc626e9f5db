"""ContextProviderInitializer (AGN-032 §5.6): fills the context providers before the reasoner runs.

Reads: the mode, whether the session is new, the turn's input items. Writes: session-scoped context
(the session's standing facts, emitted every call), turn-scoped context (the mode's welcome, armed
only when the session starts: AGN-031 §8 bootstrap), and the turn's input into its transcript: its
input items as given when it has them (``TurnExtras.input_items``), else one user message of its
``user_input``.
Next: reasoner, or client_tool_continuation_resolver on a tool-results re-entry. Fails with: nothing.
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

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Initialise the providers for this round of the turn."""
    mode = ctx.catalog.get_or_default(state.mode)
    state.providers.session_context = [f"Session {state.session_id} is in mode {mode.name!r}."]
    if env.round > 0:
        return success(Continue(StepName.CLIENT_TOOL_CONTINUATION_RESOLVER))
    if state.new_session and mode.welcome:
        state.providers.turn_context = [mode.welcome]
        trace(ctx, state, env, "welcome_armed", mode=mode.name)
    state.transcript = _turn_input(state)
    return success(Continue(StepName.REASONER))


def _turn_input(state: TurnState) -> list[dict[str, Any]]:
    """The items the turn's transcript starts with: a copy of its input items, else its user message."""
    if state.input_items is not None:
        return copy.deepcopy(state.input_items)
    return [{"type": "message", "role": "user", "content": state.user_input}]
