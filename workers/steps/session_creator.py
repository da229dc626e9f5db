"""AgentSessionCreator (AGN-032 §5.2): creates the session and starts its first turn.

Reads: the requested mode. Writes: the session row (mode: the requested one if the catalog knows
it, else the default; AGN-011 §3.1), ``state.mode``, the ``session_created`` trace step. The turn's
start usually wrote the row already, with the same rule, in the statement that started the turn
(``TurnRepository.start``, one database round trip less a new session): the step then only records it.
Next: session_context_resolver. Fails with: nothing (an unknown mode was refused at the gateway;
one that left the catalog since falls back to the default).
"""

from __future__ import annotations

from shared.db.turn_sql import SessionModes
from shared.models.envelope import TurnEnvelope
from shared.modes import ModeCatalog
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run", "session_modes"]


def session_modes(catalog: ModeCatalog) -> SessionModes:
    """The rule of a new session's mode with ``catalog``'s modes: the requested one if it knows it, else its default
    (the turn's start applies it in its statement, this step when the start did not create the session)."""
    return SessionModes(tuple(mode.name for mode in catalog.modes), catalog.default_mode)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Create the session (once, even when this step is delivered twice)."""
    if state.session_created:  # the turn's start wrote the row, in the same statement (``workers.driver``)
        trace(ctx, state, env, "session_created", mode=state.mode, created=True)
        return success(Continue(StepName.SESSION_CONTEXT_RESOLVER))
    mode = session_modes(ctx.catalog).of(state.requested_mode)
    session, created = ctx.sessions.create_if_absent(
        session_id=state.session_id, org_id=state.org_id, user_id=state.user_id, mode=mode, now=ctx.clock()
    )
    state.mode = session.mode
    trace(ctx, state, env, "session_created", mode=session.mode, created=created)
    return success(Continue(StepName.SESSION_CONTEXT_RESOLVER))
