"""ClientToolCallSessionRestorer (AGN-032 §5.4): loads the session and the turn being continued.

Reads: the session row and the turn row (the client tool results posted for this round). Writes:
``state.round``, status ``running``, the posted results into the ToolResults provider, the
persisted session mode, the ``session_restored`` trace step. Next: session_context_resolver.
Fails with: ``session_not_found``, ``continuation_mismatch`` (the turn holds no results for this round).
Raises ``TurnNotRecorded`` while the gateway's commit of the results is not yet visible.
"""

from __future__ import annotations

from shared.errors import TurnNotRecorded
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Restore the session and the paused turn's client-tool state."""
    session = ctx.sessions.get(state.session_id, org_id=state.org_id)
    if session is None:
        return failure(ErrorCode.SESSION_NOT_FOUND, f"session {state.session_id!r} does not exist")
    turn = ctx.turns.get(state.turn_id)
    if turn is not None and turn.round < env.round:
        # The gateway enqueues the re-entry before it commits the results: not visible yet.
        raise TurnNotRecorded(state.turn_id)
    if turn is None or turn.round != env.round or turn.client_tool_results is None:
        return failure(
            ErrorCode.CONTINUATION_MISMATCH, f"turn {state.turn_id!r} holds no tool results for this re-entry"
        )
    state.round = env.round
    state.status = TurnStatus.RUNNING
    state.mode = session.mode
    state.providers.client_results = [
        {"call_id": str(result["call_id"]), "output": str(result["output"])} for result in turn.client_tool_results
    ]
    trace(ctx, state, env, "session_restored", mode=session.mode, continuation=True)
    return success(Continue(StepName.SESSION_CONTEXT_RESOLVER))
