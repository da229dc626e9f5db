"""Persistence (AGN-027 layer F): the commit point of a turn.

Reads: the turn's outcome in the state. Writes, all or nothing (one statement on PostgreSQL, else
one transaction): the turn row (its ``TurnOutcome``: status, mode, output, pending tool calls,
error, usage, trace), its transcript items (user input and answer, for the next turns' context), a
snapshot of the state (to rehydrate a paused turn when Redis lost it), the session's last use and,
when the turn's organisation gets
webhooks, the status's webhook event (and its batch's, if this was the batch's last turn in flight)
as outbox rows (``shared.db.webhook_outbox``; a webhook never fails the turn). Then, when it wrote, the
turn event that ends the round, in the state's outbox (sent with the state's save):
``turn.requires_client_tools`` or ``turn.completed`` / ``turn.failed``, whose data is the turn as
``GET /v1/turns/{id}`` shows it from now on. Next: Stop, saying which status it wrote (none when the
turn had already ended otherwise, e.g. cancelled: whoever ended it sent its event), which webhook
deliveries it recorded (the driver hands them to the webhooks queue) and the turn's tokens so far, for
its organisation's count of the day it was created (``shared.state.token_usage``, the daily budget's:
the save that ends the chain merges them, so a commit run twice counts once). Fails with: nothing (a
database blip raises and the task is retried).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.db.records import TurnOutcome
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import InvokeResult, success
from shared.state import OutboxEvent, TurnState
from shared.state.token_usage import TurnTokens
from shared.turn_events import ROUND_END_EVENTS
from shared.turn_view import committed_turn, turn_json
from workers.context import StepContext
from workers.next_step import Next, Stop
from workers.trace import trace

__all__ = ["run"]


def run(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    """Commit the turn."""
    if not any(step.kind == "committed" and step.data.get("round") == env.round for step in state.trace):
        trace(ctx, state, env, "committed", status=state.status.value)
    transcript: list[tuple[str, str]] = []
    if state.status is TurnStatus.COMPLETED:
        transcript = [("user", state.user_input), ("assistant", state.output_text or "")]
    now = ctx.clock()
    committed = ctx.turns.commit(
        state.turn_id,
        TurnOutcome.of(state),
        transcript=transcript,
        snapshot=state.checkpoint(),
        now=now,
        org_id=state.org_id,
    )
    if committed is None:
        return success(Stop(committed=None))
    day = (state.created_at or now).astimezone(UTC).date()
    tokens = TurnTokens(state.org_id, day, state.turn_id, state.usage.input_tokens + state.usage.output_tokens)
    event = ROUND_END_EVENTS.get(state.status)
    if event is not None:
        state.outbox.append(OutboxEvent(event=event, data=_committed(ctx, state, now)))
    return success(Stop(committed=state.status, deliveries=tuple(committed.deliveries), tokens=tokens))


def _committed(ctx: StepContext, state: TurnState, now: datetime) -> dict[str, Any]:
    created_at = state.created_at
    if created_at is None:  # a state from before it carried its acceptance time
        record = ctx.turns.get(state.turn_id)
        created_at = now if record is None else record.created_at
    return turn_json(committed_turn(state, created_at=created_at, committed_at=now))
