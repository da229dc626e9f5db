"""SessionContextResolver (AGN-032 §5.5): resolves the conversation context and the mode.

Reads: the session's earlier completed turns, the mode catalog. Writes: ``state.history`` (earlier
user inputs and answers as input items), ``state.mode`` (the default when the persisted mode left
the catalog). Next: context_provider_initializer. Fails with: nothing.
"""

from __future__ import annotations

import logging

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next

__all__ = ["load_history", "run"]

logger = logging.getLogger(__name__)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Load the conversation context of the session and settle the turn's mode."""
    if ctx.catalog.get(state.mode) is None:
        logger.warning("session %s is in mode %r, which the catalog no longer has", state.session_id, state.mode)
        state.mode = ctx.catalog.default_mode
    load_history(ctx, state)
    return success(Continue(StepName.CONTEXT_PROVIDER_INITIALIZER))


def load_history(ctx: StepContext, state: TurnState) -> None:
    """Set ``state.history``: the session's completed turns before this one, as input items.

    Also used when a turn carries on from a database checkpoint, which does not keep the history.
    A turn that opened its session has none, so it asks the database nothing.
    """
    if state.new_session:
        state.history = []
        return
    before = state.created_at or ctx.clock()
    conversation = ctx.turns.conversation(state.session_id, before=before, limit=ctx.settings.history_turns)
    state.history = [{"type": "message", "role": role, "content": content} for role, content in conversation]
