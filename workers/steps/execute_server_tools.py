"""Server Tool Execution (AGN-027 layer D): the server calls of one LLM response, in order.

Reads: the tool ledger's pending server calls of this iteration, each call's durable tool-run record.
Writes: a durable "started" record before each handler runs and its outcome after
(``shared.db.tool_runs``); each call's result into the ledger (the ToolResults provider) and a
``function_call_output`` into the transcript; a ``tool_execution`` trace step per call; mode
changes (via ``agent_change_mode``). A call's outcome is found by a redelivered step in its durable
record; when that record cannot be written, the state (the ledger showing the call done) is saved in
Redis before the step fails, so a redelivered step finds the outcome in one of the two, never
"started" only. The driver saves the state once the step's task ends.

At most once: a call whose record shows an outcome is not run again (its recorded output is
used); a call found "started" without an outcome (its worker died while it ran) is not run again:
the model is told the outcome is unknown and the trace says so. Tools the catalog marks
``idempotent: true`` (and the built-ins) keep no record and simply run again.
Next: reasoner. Fails with: ``tool_failed`` (a handler raised or timed out).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from shared.db.tool_runs import ToolRunStatus
from shared.models.envelope import TurnEnvelope
from shared.modes import CHANGE_MODE_TOOL
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.retry import retry_dropped_connection
from workers.tools.executor import ToolContext, parse_arguments
from workers.tools.mode_change import change_mode
from workers.tools.registry import ServerTool
from workers.trace import trace

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Run every pending server call of this iteration, sequentially."""
    pending = [e for e in state.ledger if e.kind == "server" and e.status == "pending" and e.iteration == env.iteration]
    if sum(e.name == CHANGE_MODE_TOOL for e in pending) > 1:
        logger.warning(
            "turn %s: %d mode changes in one response; the last successful one wins", state.turn_id, len(pending)
        )
    for entry in pending:
        started = time.perf_counter()
        result, record = _execute_once(ctx, env, state, entry)
        duration_ms = (time.perf_counter() - started) * 1000
        if not result.ok:
            assert result.error is not None
            entry.status = "failed"
            trace(
                ctx,
                state,
                env,
                "tool_execution",
                duration_ms=duration_ms,
                tool=entry.name,
                call_id=entry.call_id,
                ok=False,
            )
            record()
            return failure(result.error.code, result.error.message)
        entry.status = "done"
        entry.output = result.value
        state.transcript.append({"type": "function_call_output", "call_id": entry.call_id, "output": result.value})
        trace(
            ctx, state, env, "tool_execution", duration_ms=duration_ms, tool=entry.name, call_id=entry.call_id, ok=True
        )
        # The durable record is what a step that runs again reads; should it fail, the ledger in Redis records the
        # outcome instead: a step that runs again finds the call done in either, never "started" only. (An
        # idempotent call keeps neither: it may simply run again, as a built-in reading the clock does.)
        try:
            record()
        except Exception:
            ctx.states.save(state, ttl_seconds=ctx.state_ttl_seconds, alive_until=ctx.alive_until())
            raise
    return success(Continue(StepName.REASONER, env.iteration))


def _execute_once(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, entry: LedgerEntry
) -> tuple[InvokeResult[str], Callable[[], None]]:
    """Run the call unless it ran before; returns its result and what records the outcome durably."""
    tool = ctx.tools.get(entry.name)
    if tool is None:
        return failure(ErrorCode.UNKNOWN_TOOL, f"server tool {entry.name!r} is not registered"), _nothing
    if tool.idempotent:
        # Running it again is harmless by definition (and agent_change_mode must re-apply its change
        # to a turn carried on from a checkpoint), so it needs no durable record.
        return _execute(ctx, env, state, entry, tool), _nothing
    owner = f"{ctx.hostname}/{uuid.uuid4().hex[:12]}"
    earlier = retry_dropped_connection(
        lambda: ctx.tool_runs.start(
            turn_id=state.turn_id, call_id=entry.call_id, name=entry.name, worker=owner, now=ctx.clock()
        )
    )
    if earlier is not None and earlier.worker == owner:
        earlier = None  # our own start, whose commit landed although its answer was lost
    if earlier is not None and earlier.status != "started":
        trace(ctx, state, env, "tool_outcome_replayed", tool=entry.name, call_id=entry.call_id, status=earlier.status)
        output = earlier.output or ""
        return (failure(ErrorCode.TOOL_FAILED, output) if earlier.status == "failed" else success(output)), _nothing
    if earlier is not None:
        started_on = earlier.worker.split("/")[0]
        message = (
            f"error: the outcome of this {entry.name} call is unknown: it was started on {started_on}, which "
            "stopped before recording a result, and it is not run twice. Check whether it took effect before "
            "trying again."
        )
        logger.warning(
            "turn %s: %s call %s started before and has no outcome; not run again",
            state.turn_id,
            entry.name,
            entry.call_id,
        )
        trace(ctx, state, env, "tool_outcome_unknown", tool=entry.name, call_id=entry.call_id, started_on=started_on)
        return success(message), _recorder(ctx, state, entry, "unknown", message)
    result = _execute(ctx, env, state, entry, tool)
    if result.ok:
        assert result.value is not None
        return result, _recorder(ctx, state, entry, "succeeded", result.value)
    assert result.error is not None
    return result, _recorder(ctx, state, entry, "failed", result.error.message)


def _recorder(
    ctx: StepContext, state: TurnState, entry: LedgerEntry, status: ToolRunStatus, output: str
) -> Callable[[], None]:
    def record() -> None:
        retry_dropped_connection(
            lambda: ctx.tool_runs.finish(
                turn_id=state.turn_id, call_id=entry.call_id, status=status, output=output, now=ctx.clock()
            )
        )

    return record


def _nothing() -> None:
    return None


def _execute(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, entry: LedgerEntry, tool: ServerTool
) -> InvokeResult[str]:
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
        call_id=entry.call_id,
        idempotency_key=f"{state.turn_id}:{entry.call_id}",
    )
    return ctx.executor.run(tool, arguments, context)
