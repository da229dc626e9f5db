"""TurnRepository on SQLite: conversation context order and limit, the commit point's idempotence."""

from __future__ import annotations

from datetime import timedelta

from shared.db.turns import NewTurn
from shared.models.turn import TurnStatus, Usage
from tests.unit.fakes import FIXED_NOW, make_context
from workers.context import StepContext


def _turn(ctx: StepContext, index: int) -> str:
    turn_id = f"turn_{index:032d}"
    ctx.turns.create(
        NewTurn(turn_id=turn_id, session_id="sess_1", org_id="o", user_id="u", new_session=index == 0,
                requested_mode=None, request={"input": f"q{index}"}, request_hash="h"),
        now=FIXED_NOW + timedelta(seconds=index), deadline_at=FIXED_NOW + timedelta(seconds=60 + index),
    )  # fmt: skip
    return turn_id


def _commit(ctx: StepContext, turn_id: str, index: int, status: TurnStatus = TurnStatus.COMPLETED) -> None:
    ctx.turns.commit(
        turn_id, status=status, mode="general", output_text=f"a{index}", pending_tool_calls=[], mode_changes=[],
        error=None, usage=Usage(), trace=[], transcript=[("user", f"q{index}"), ("assistant", f"a{index}")],
        snapshot={}, now=FIXED_NOW + timedelta(seconds=index, milliseconds=500),
    )  # fmt: skip


def test_conversation_is_the_last_completed_turns_oldest_first() -> None:
    ctx = make_context()
    for index in range(3):
        _commit(ctx, _turn(ctx, index), index)
    later = FIXED_NOW + timedelta(seconds=10)
    assert ctx.turns.conversation("sess_1", before=later, limit=2) == [
        ("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")
    ]  # fmt: skip
    assert ctx.turns.conversation("sess_1", before=FIXED_NOW + timedelta(seconds=1), limit=5) == [
        ("user", "q0"), ("assistant", "a0")
    ]  # fmt: skip


def test_commit_twice_leaves_one_set_of_transcript_items() -> None:
    ctx = make_context()
    turn_id = _turn(ctx, 0)
    _commit(ctx, turn_id, 0)
    _commit(ctx, turn_id, 0)
    assert ctx.turns.conversation("sess_1", before=FIXED_NOW + timedelta(seconds=5), limit=5) == [
        ("user", "q0"), ("assistant", "a0")
    ]  # fmt: skip


def test_commit_never_overwrites_a_cancelled_turn() -> None:
    ctx = make_context()
    turn_id = _turn(ctx, 0)
    from shared.result import ErrorCode, ErrorInfo

    ctx.turns.finish_early(
        turn_id, status=TurnStatus.CANCELLED, error=ErrorInfo(code=ErrorCode.CANCELLED, message="x"),
        now=FIXED_NOW, only_if=("queued", "running"),
    )  # fmt: skip
    _commit(ctx, turn_id, 0)
    row = ctx.turns.get(turn_id)
    assert row is not None and row.status == "cancelled" and row.output_text is None


def test_create_if_absent_creates_a_session_once_on_sqlite() -> None:
    ctx = make_context()
    first, created = ctx.sessions.create_if_absent(
        session_id="sess_2", org_id="o", user_id="u", mode="general", now=FIXED_NOW
    )
    again, created_again = ctx.sessions.create_if_absent(
        session_id="sess_2", org_id="o", user_id="u", mode="support", now=FIXED_NOW + timedelta(seconds=1)
    )
    assert (created, created_again) == (True, False)
    assert (first.mode, again.mode, again.created_at) == ("general", "general", FIXED_NOW)
