"""AgentSessionRestorer (AGN-032 §5.3): loads an existing session for a brand-new turn.

Reads: the session row. Writes: ``state.mode`` from the persisted session, overwriting the
client's mode (AGN-011 §3.3; a mismatch is logged as a warning), the ``session_restored`` trace
step. Next: session_context_resolver. Fails with: ``session_not_found``.
"""

from __future__ import annotations

import logging

from shared.models.envelope import TurnEnvelope
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Restore the session and normalise the turn's mode to the persisted one."""
    session = ctx.sessions.get(state.session_id, org_id=state.org_id)
    if session is None:
        return failure(ErrorCode.SESSION_NOT_FOUND, f"session {state.session_id!r} does not exist")
    if state.requested_mode and state.requested_mode != session.mode:
        logger.warning(
            "client sent mode %r for session %s, which is in mode %r; using the persisted mode",
            state.requested_mode,
            state.session_id,
            session.mode,
        )
    state.mode = session.mode
    trace(ctx, state, env, "session_restored", mode=session.mode, client_mode=state.requested_mode)
    return success(Continue(StepName.SESSION_CONTEXT_RESOLVER))
