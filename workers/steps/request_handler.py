"""AgentRequestHandler (AGN-032 §5.1): entry; builds the turn state and routes it.

Reads: the turn record the gateway wrote. Writes: a new TurnState (first round), the ``turn_start``
trace step. The turn's durable start (status ``running`` with a fresh reconciler deadline) is
recorded as the driver reads the record for the turn's first message, in the same statement
(``workers.driver``; a turn that ended before it started never gets here). Next: session_creator
(new session), session_restorer (follow-up turn) or client_tool_session_restorer (tool-results
re-entry). Fails with: nothing of its own.

The commit that AGN-032 gives this handler "once downstream returns" is the ``persist`` step: in a
chain of tasks, downstream returns by sending the turn there.
"""

from __future__ import annotations

from shared.db.records import TurnRecord
from shared.models.envelope import TurnEnvelope
from shared.models.turn import ClientTool
from shared.openai import TurnExtras
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["initial_state", "run"]


def initial_state(record: TurnRecord) -> TurnState:
    """The initial state of a turn from its recorded request.

    Args:
        record: the turn as the gateway recorded it.

    Returns:
        A state carrying the record's identity (``shared.db.records.IDENTITY_FIELDS``), its
        acceptance time, its request and the request's extras (``shared.openai.TurnExtras``: input
        items, instructions, model and model options; none for a turn of ``/v1/turns``).
    """
    extras = TurnExtras.of(record.request)
    return TurnState(
        **record.identity(),
        created_at=record.created_at,
        user_input=str(record.request["input"]),
        client_tools=[ClientTool.model_validate(tool) for tool in record.request.get("tools", [])],
        stream=bool(record.request.get("stream", False)),
        input_items=extras.input_items,
        instructions=extras.instructions,
        model=extras.model,
        model_options=extras.model_options,
    )


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Start (or re-enter) the turn and choose its session path."""
    if env.round > 0:
        trace(ctx, state, env, "turn_reentered")
        return success(Continue(StepName.CLIENT_TOOL_SESSION_RESTORER))
    trace(ctx, state, env, "turn_start", session_id=state.session_id, new_session=state.new_session)
    if state.new_session:
        return success(Continue(StepName.SESSION_CREATOR))
    return success(Continue(StepName.SESSION_RESTORER))
