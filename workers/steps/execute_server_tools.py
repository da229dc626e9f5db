"""Server Tool Execution (AGN-027 layer D): the server calls of one LLM response, in order.

Reads: the tool ledger's pending server calls of this iteration. Writes: each call's result into
the ledger (the ToolResults provider) and a ``function_call_output`` into the transcript, a
``tool_execution`` trace step per call, mode changes (via ``agent_change_mode``). The state is
saved after every call, so a redelivered step never runs a call the ledger shows as done.
Next: reasoner. Fails with: ``tool_failed`` (a handler raised or timed out).
"""

from __future__ import annotations

import logging
import time

from shared.models.envelope import TurnEnvelope
from shared.modes import CHANGE_MODE_TOOL
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.tools.executor import ToolContext, parse_arguments, run_tool
from workers.tools.mode_change import change_mode
from workers.trace import trace

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Run every pending server call of this iteration, sequentially."""
    pending = [e for e in state.ledger if e.kind == "server" and e.status == "pending" and e.iteration == env.iteration]
    if sum(e.name == CHANGE_MODE_TOOL for e in pending) > 1:
        logger.warning("turn %s: %d mode changes in one response; the last successful one wins", state.turn_id, len(pending))
    for entry in pending:
        started = time.perf_counter()
        result = _execute(ctx, env, state, entry)
        duration_ms = (time.perf_counter() - started) * 1000
        if not result.ok:
            assert result.error is not None
            entry.status = "failed"
            trace(ctx, state, env, "tool_execution", duration_ms=duration_ms, tool=entry.name, call_id=entry.call_id, ok=False)
            return failure(result.error.code, result.error.message)
        entry.status = "done"
        entry.output = result.value
        state.transcript.append({"type": "function_call_output", "call_id": entry.call_id, "output": result.value})
        trace(ctx, state, env, "tool_execution", duration_ms=duration_ms, tool=entry.name, call_id=entry.call_id, ok=True)
        ctx.store.save(state, ttl_seconds=ctx.state_ttl_seconds)
    return success(Continue(StepName.REASONER, env.iteration))


def _execute(ctx: StepContext, env: TurnEnvelope, state: TurnState, entry: LedgerEntry) -> InvokeResult[str]:
    tool = ctx.tools.get(entry.name)
    if tool is None:
        return failure(ErrorCode.UNKNOWN_TOOL, f"server tool {entry.name!r} is not registered")
    arguments = parse_arguments(tool, entry.arguments)
    if isinstance(arguments, str):
        trace(ctx, state, env, "tool_arguments_rejected", tool=entry.name, call_id=entry.call_id)
        return success(arguments)
    if tool.name == CHANGE_MODE_TOOL:
        return success(change_mode(ctx, env, state, arguments))
    context = ToolContext(
        session_id=state.session_id,
        turn_id=state.turn_id,
        org_id=state.org_id,
        user_id=state.user_id,
        mode=state.mode or ctx.catalog.default_mode,
    )
    return run_tool(tool, arguments, context)
