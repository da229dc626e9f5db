"""TurnRepository on SQLite: conversation context order and limit, the commit point's idempotence, the
turn records it takes and returns (one set of fields from a new turn to its snapshot), and the writes
that stay open for the caller's block (a refusal at the write or at the commit reads the same)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import FrozenInstanceError, asdict, fields, replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from shared.db.batches import BatchKeyTaken, BatchRecord, BatchRepository, ReusedTurn, TurnKeyTaken
from shared.db.records import IDENTITY_FIELDS, TurnRecord
from shared.db.sessions import ModeHistoryRecord, SessionRecord
from shared.db.tables import IN_FLIGHT_SQL, UNFINISHED_SQL, Base, BatchRow, TurnRow
from shared.db.turn_sql import new_turn_row
from shared.db.turns import NewTurn, SessionBusy, TurnOutcome, TurnRepository
from shared.models.turn import ModeChange, PendingToolCall, TurnStatus, Usage
from shared.state import TurnState
from shared.turn_view import to_turn
from tests.support.turn_starts import check_a_start_creates_a_new_sessions_row_in_its_mode
from tests.unit.fakes import FIXED_NOW, make_context, sqlite_db
from workers.context import StepContext
from workers.steps.request_handler import initial_state


def _turn(ctx: StepContext, index: int) -> str:
    turn_id = f"turn_{index:032d}"
    ctx.turns.create(
        NewTurn(turn_id=turn_id, session_id="sess_1", org_id="o", user_id="u", new_session=index == 0,
                requested_mode=None, request={"input": f"q{index}"}, request_hash="h"),
        now=FIXED_NOW + timedelta(seconds=index), deadline_at=FIXED_NOW + timedelta(seconds=60 + index),
    )  # fmt: skip
    return turn_id


def _commit(ctx: StepContext, turn_id: str, index: int, status: TurnStatus = TurnStatus.COMPLETED) -> None:
    outcome = TurnOutcome(
        status=status,
        mode="general",
        output_text=f"a{index}",
        pending_tool_calls=[],
        mode_changes=[],
        error=None,
        usage=Usage(),
        trace=[],
    )
    ctx.turns.commit(
        turn_id, outcome, transcript=[("user", f"q{index}"), ("assistant", f"a{index}")], snapshot={},
        now=FIXED_NOW + timedelta(seconds=index, milliseconds=500),
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


def test_a_turns_start_creates_its_new_session_in_the_same_transaction_on_sqlite() -> None:
    ctx = make_context()
    check_a_start_creates_a_new_sessions_row_in_its_mode(ctx.turns, ctx.sessions)


def test_get_returns_a_frozen_turn_record_not_an_orm_row() -> None:
    ctx = make_context()
    turn_id = _turn(ctx, 0)
    record = ctx.turns.get(turn_id)
    assert isinstance(record, TurnRecord) and not isinstance(record, Base)
    assert record.status is TurnStatus.QUEUED and record.status == "queued"
    with pytest.raises(FrozenInstanceError):
        record.status = TurnStatus.RUNNING  # type: ignore[misc]  # the point: a record cannot be changed


def test_a_turn_record_has_a_field_for_each_column_of_the_turns_table() -> None:
    assert {field.name for field in fields(TurnRecord)} == set(TurnRow.__table__.columns.keys())


def test_turn_state_carries_the_identity_and_the_outcome_under_the_same_names() -> None:
    carried = {*IDENTITY_FIELDS, *(field.name for field in fields(TurnOutcome))}
    assert carried <= set(TurnState.model_fields)
    assert set(IDENTITY_FIELDS) <= {field.name for field in fields(NewTurn)}


def test_a_turn_round_trips_from_new_to_committed_to_snapshot() -> None:
    # Given a recorded turn and the state it starts with
    ctx = make_context()
    new = NewTurn(
        turn_id="turn_" + "7" * 32, session_id="sess_7", org_id="o", user_id="u", new_session=True,
        requested_mode="general", request={"input": "hello"}, request_hash="h", batch_id="batch_7", batch_index=0,
    )  # fmt: skip
    created, was_created = ctx.turns.create(new, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    assert was_created and isinstance(created, TurnRecord)
    assert {field.name: getattr(created, field.name) for field in fields(NewTurn)} == asdict(new)
    state = initial_state(created)
    assert (state.turn_id, state.batch_id, state.requested_mode, state.user_input, state.created_at) == (
        new.turn_id, "batch_7", "general", "hello", FIXED_NOW
    )  # fmt: skip

    # When it finishes and commits what its state holds
    state.status, state.mode, state.output_text = TurnStatus.COMPLETED, "general", "hi"
    state.mode_changes = [ModeChange(from_mode="general", to_mode="support", reason="asked")]
    state.usage = Usage(llm_calls=1, input_tokens=3, output_tokens=2)
    state.record("turn_completed", at=FIXED_NOW, step="persist", worker="w")
    outcome = TurnOutcome.of(state)
    later = FIXED_NOW + timedelta(seconds=2)
    assert ctx.turns.commit(new.turn_id, outcome, transcript=[], snapshot=state.checkpoint(), now=later)

    # Then the record, the API view and the snapshot all say the same
    committed = ctx.turns.get(new.turn_id)
    assert committed is not None
    assert {name: getattr(committed, name) for name in outcome.columns()} == outcome.columns()
    assert committed.identity() == created.identity() and committed.completed_at == later
    view = to_turn(committed)
    assert (view.status, view.mode, view.output_text, view.mode_changes, view.usage) == (
        outcome.status, outcome.mode, outcome.output_text, outcome.mode_changes, outcome.usage
    )  # fmt: skip
    snapshot = ctx.turns.load_snapshot(new.turn_id)
    assert snapshot is not None
    restored = TurnState.model_validate(snapshot)
    assert TurnOutcome.of(restored) == outcome
    assert {name: getattr(restored, name) for name in IDENTITY_FIELDS} == created.identity()


def test_the_partial_indexes_keep_the_text_of_their_migrations() -> None:
    migrations = Path(__file__).resolve().parents[2] / "shared" / "db" / "migrations" / "versions"
    assert f'sa.text("{UNFINISHED_SQL}")' in (migrations / "0001_initial_schema.py").read_text()
    assert f'sa.text("{IN_FLIGHT_SQL}")' in (migrations / "0004_recovery.py").read_text()
    (batch_turn_order,) = migrations.glob("*_batch_turn_order.py")
    assert f'sa.text("{IN_FLIGHT_SQL}")' in batch_turn_order.read_text()


def test_session_repository_returns_records_not_orm_rows() -> None:
    ctx = make_context()
    created, _ = ctx.sessions.create_if_absent(
        session_id="sess_3", org_id="o", user_id="u", mode="general", now=FIXED_NOW
    )
    ctx.sessions.set_mode(
        "sess_3", turn_id="turn_3", seq=0, from_mode="general", to_mode="support", reason="asked", org_id="o",
        user_id="u", now=FIXED_NOW + timedelta(seconds=1),
    )  # fmt: skip
    stored = ctx.sessions.get("sess_3")
    history = ctx.sessions.mode_history("sess_3")
    assert isinstance(created, SessionRecord) and isinstance(stored, SessionRecord)
    assert (stored.mode, stored.version) == ("support", 2)
    assert [type(entry) for entry in history] == [ModeHistoryRecord]
    assert (history[0].from_mode, history[0].to_mode, history[0].turn_id) == ("general", "support", "turn_3")


def test_batch_repository_takes_and_returns_records() -> None:
    # Given a batch of two turns recorded together
    batches = BatchRepository(sqlite_db())
    batch = BatchRecord(batch_id="batch_1", org_id="o", user_id="u", total=2, created_at=FIXED_NOW)
    turns = [
        NewTurn(turn_id=f"turn_{index:032d}", session_id=f"sess_b{index}", org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": "q"}, request_hash="h", batch_id="batch_1", batch_index=index)
        for index in range(2)
    ]  # fmt: skip
    with batches.creating(batch, turns, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60)):
        pass

    # Then it reads back as records, the turns in request order
    assert batches.get("batch_1", org_id="o") == batch
    assert batches.get("batch_1", org_id="other") is None
    read = list(batches.turns("batch_1", chunk=1))
    assert [type(turn) for turn in read] == [TurnRecord, TurnRecord]
    assert [turn.turn_id for turn in read] == [turn.turn_id for turn in turns]


@pytest.mark.parametrize("chunk", [1, 2, 3, 500])
def test_a_batchs_turns_come_in_request_order_page_after_page_with_its_reused_turns_in_their_places(
    chunk: int,
) -> None:
    # Given earlier turns, and a batch of ten requests of which 0, 3, 4 and 9 named those turns by key:
    # its own turns' batch_index has gaps (1, 2, 5, 6, 7, 8) that its reused turns fill
    batches = BatchRepository(sqlite_db())
    deadline = FIXED_NOW + timedelta(seconds=60)

    def new_turn(batch_id: str, index: int) -> NewTurn:
        return NewTurn(turn_id=f"turn_{batch_id}_{index:02d}", session_id=f"sess_{batch_id}_{index}", org_id="o",
                       user_id="u", new_session=True, requested_mode=None, request={"input": "q"}, request_hash="h",
                       batch_id=batch_id, batch_index=index)  # fmt: skip

    earlier = [new_turn("b0", index) for index in range(4)]
    first = BatchRecord(batch_id="b0", org_id="o", user_id="u", total=4, created_at=FIXED_NOW)
    with batches.creating(first, earlier, now=FIXED_NOW, deadline_at=deadline):
        pass
    reused = [ReusedTurn(index, turn.turn_id) for index, turn in zip((0, 3, 4, 9), earlier, strict=True)]
    own = [new_turn("b1", index) for index in (1, 2, 5, 6, 7, 8)]
    second = BatchRecord(batch_id="b1", org_id="o", user_id="u", total=10, created_at=FIXED_NOW, reused=4)
    with batches.creating(second, own, now=FIXED_NOW, deadline_at=deadline, reused=reused):
        pass

    # When its turns are read, chunk at a time
    read = [turn.turn_id for turn in batches.turns("b1", chunk=chunk)]

    # Then each request's turn comes once, in request order, wherever the pages of the two reads end
    by_index = {turn.batch_index: turn.turn_id for turn in own} | {r.batch_index: r.turn_id for r in reused}
    assert read == [by_index[index] for index in range(10)]


def test_a_turn_recorded_with_stream_starts_with_its_state_streaming() -> None:
    ctx = make_context()
    plain = _turn(ctx, 0)
    streamed = NewTurn(
        turn_id="turn_" + "8" * 32, session_id="sess_8", org_id="o", user_id="u", new_session=True,
        requested_mode=None, request={"input": "q", "stream": True}, request_hash="h",
    )  # fmt: skip
    created, _ = ctx.turns.create(streamed, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    record = ctx.turns.get(plain)
    assert record is not None
    assert initial_state(created).stream and not initial_state(record).stream


def test_accepting_tool_results_keeps_the_paused_round_as_it_stood() -> None:
    # Given a turn paused at round 0 for one client call, with some text and usage
    ctx = make_context()
    turn_id = _turn(ctx, 0)
    pending = [PendingToolCall(call_id="call_1", name="open_file", arguments='{"path": "a"}')]
    outcome = TurnOutcome(
        status=TurnStatus.REQUIRES_CLIENT_TOOLS, mode="general", output_text="let me look", pending_tool_calls=pending,
        mode_changes=[], error=None, usage=Usage(llm_calls=1, input_tokens=5, output_tokens=3), trace=[],
    )  # fmt: skip
    assert ctx.turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=FIXED_NOW)
    assert (record := ctx.turns.get(turn_id)) is not None and record.paused_rounds == []
    # When its results are accepted
    later = FIXED_NOW + timedelta(seconds=1)
    round_ = ctx.turns.accept_tool_results(turn_id, results=[{"call_id": "call_1", "output": "x"}], now=later,
                                           deadline_at=later + timedelta(seconds=60))  # fmt: skip
    # Then the turn runs round 1 and keeps round 0 as it paused
    record = ctx.turns.get(turn_id)
    assert round_ == 1 and record is not None and (record.round, record.status) == (1, TurnStatus.RUNNING)
    assert record.pending_tool_calls == []
    assert record.paused_rounds == [{
        "round": 0, "at": FIXED_NOW.isoformat(),
        "pending_tool_calls": [call.model_dump(mode="json") for call in pending], "output_text": "let me look",
        "usage": outcome.usage.model_dump(mode="json"), "mode": "general", "mode_changes": [],
    }]  # fmt: skip
    # And results posted again while it runs change nothing
    assert ctx.turns.accept_tool_results(turn_id, results=[], now=later, deadline_at=later) is None
    assert (again := ctx.turns.get(turn_id)) is not None and again.paused_rounds == record.paused_rounds


LATER = FIXED_NOW + timedelta(seconds=60)


def _new_turn(index: int, **changes: object) -> NewTurn:
    turn = NewTurn(
        turn_id=f"turn_{index:032d}", session_id=f"sess_{index}", org_id="o", user_id="u", new_session=True,
        requested_mode=None, request={"input": "q"}, request_hash="h",
    )  # fmt: skip
    return replace(turn, **changes)  # type: ignore[arg-type]  # the fields' own types


@contextmanager
def _at_commit(db: sessionmaker[Session], row: object) -> Iterator[None]:
    """``row`` joins the next transaction of ``db`` as it commits: a constraint that refuses it refuses
    the commit (SQLite checks each statement as it runs; this stands for a check at commit)."""

    def add(session: Session) -> None:
        session.add(row)

    event.listen(db, "before_commit", add, once=True)
    try:
        yield
    finally:
        if event.contains(db, "before_commit", add):
            event.remove(db, "before_commit", add)


def test_a_turn_whose_block_raises_is_not_recorded_and_a_replay_gives_the_block_the_earlier_turn() -> None:
    turns = TurnRepository(sqlite_db())
    first = _new_turn(1, idempotency_key="k")
    with pytest.raises(RuntimeError), turns.creating(first, now=FIXED_NOW, deadline_at=LATER) as created:
        assert created.new and created.turn.turn_id == first.turn_id
        raise RuntimeError("the broker refused")
    assert turns.get(first.turn_id) is None

    recorded, new = turns.create(first, now=FIXED_NOW, deadline_at=LATER)
    with turns.creating(replace(first, turn_id="turn_" + "2" * 32), now=FIXED_NOW, deadline_at=LATER) as again:
        assert (again.turn, again.new) == (recorded, False)
    assert new


@pytest.mark.parametrize("when", ["write", "commit"])
def test_a_session_busy_at_the_commit_reads_as_one_at_the_write(when: str) -> None:
    # Given a session with an unfinished turn, recorded before or joining the transaction as it commits
    db = sqlite_db()
    turns = TurnRepository(db)
    rival = new_turn_row(_new_turn(1), now=FIXED_NOW, deadline_at=LATER)
    if when == "write":
        turns.create(_new_turn(1), now=FIXED_NOW, deadline_at=LATER)
    blocks: list[bool] = []
    # When another turn of the session is recorded
    with (
        pytest.raises(SessionBusy),
        _at_commit(db, rival) if when == "commit" else nullcontext(),
        turns.creating(_new_turn(2, session_id="sess_1"), now=FIXED_NOW, deadline_at=LATER) as created,
    ):
        blocks.append(created.new)
    # Then it is refused either way, and not recorded (at the commit, after its block ran)
    assert blocks == ([True] if when == "commit" else [])
    assert turns.get(_new_turn(2).turn_id) is None


@pytest.mark.parametrize("when", ["write", "commit"])
@pytest.mark.parametrize(
    ("rival", "refusal"),
    [
        pytest.param(lambda: BatchRow(batch_id="batch_0", org_id="o", user_id="u", total=0, created_at=FIXED_NOW,
                                      idempotency_key="bk", request_hash="x", reused=0), BatchKeyTaken, id="batch-key"),
        pytest.param(lambda: new_turn_row(_new_turn(9, idempotency_key="tk"), now=FIXED_NOW, deadline_at=LATER),
                     TurnKeyTaken, id="request-key"),
        pytest.param(lambda: new_turn_row(_new_turn(9, session_id="sess_1"), now=FIXED_NOW, deadline_at=LATER),
                     SessionBusy, id="session"),
    ],
)  # fmt: skip
def test_a_batch_refused_at_the_commit_reads_as_one_refused_at_the_write(
    when: str, rival: Callable[[], object], refusal: type[Exception]
) -> None:
    # Given a row that takes the batch's key, a request's key or a session, committed before or joining
    # the batch's transaction as it commits
    db = sqlite_db()
    batches = BatchRepository(db)
    if when == "write":
        with db.begin() as orm:
            orm.add(rival())
    batch = BatchRecord(batch_id="batch_1", org_id="o", user_id="u", total=2, created_at=FIXED_NOW,
                        idempotency_key="bk")  # fmt: skip
    new = [_new_turn(1, batch_id="batch_1", batch_index=0, idempotency_key="tk"),
           _new_turn(2, batch_id="batch_1", batch_index=1)]  # fmt: skip
    blocks: list[list[str]] = []
    # When the batch is recorded
    with (
        pytest.raises(refusal),
        _at_commit(db, rival()) if when == "commit" else nullcontext(),
        batches.creating(batch, new, now=FIXED_NOW, deadline_at=LATER) as turn_ids,
    ):
        blocks.append(list(turn_ids))
    # Then the same refusal either way, and nothing of the batch recorded
    assert blocks == ([[turn.turn_id for turn in new]] if when == "commit" else [])
    assert batches.get("batch_1", org_id="o") is None
    assert TurnRepository(db).get(new[1].turn_id) is None
