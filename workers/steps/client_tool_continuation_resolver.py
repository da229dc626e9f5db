"""ClientToolContinuationResolver (AGN-032 §5.7): prepares the continuation for the reasoner.

Reads: the ToolResults provider (the client's outputs) and the tool ledger. Writes: marks the
state as a continuation the reasoner must verify before it calls the LLM again; the
``continuation_resolved`` trace step. Next: reasoner. Fails with: nothing (verification is the
reasoner's, AGN-031 §6).
"""

from __future__ import annotations

from shared.models.envelope import TurnEnvelope
from shared.result import InvokeResult, success
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.trace import trace

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Hand the posted client results to the reasoner for verification."""
    expected = [e.call_id for e in state.ledger if e.kind == "client" and e.status == "pending"]
    state.continuation = True
    trace(
        ctx,
        state,
        env,
        "continuation_resolved",
        expected=expected,
        posted=[result["call_id"] for result in state.providers.client_results],
    )
    return success(Continue(StepName.REASONER))
