"""The repositories' hot-path statements on a real PostgreSQL: session creation as one upsert, the
turn's commit as its session's last use, a worker's engine (no pre-ping) after its backends
were terminated, and two requests racing to record a turn with one idempotency key or session."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from shared.db.engine import create_db_engine, session_factory
from shared.db.sessions import SessionRepository
from shared.db.turns import IdempotencyConflict, NewTurn, SessionBusy, TurnOutcome, TurnRepository
from shared.models.turn import PendingToolCall, TurnStatus, Usage
from tests.support.turn_starts import check_a_start_creates_a_new_sessions_row_in_its_mode, new_turn
from tests.support.waiting import wait_for
from tests.unit.fakes import FIXED_NOW


def _session_id() -> str:
    return f"sess_{uuid.uuid4().hex}"


def test_create_if_absent_creates_once_and_then_returns_the_first_session(database_url: str) -> None:
    sessions = SessionRepository(session_factory(create_db_engine(database_url)))
    session_id = _session_id()
    first, created = sessions.create_if_absent(
        session_id=session_id, org_id="o", user_id="u", mode="general", now=FIXED_NOW
    )
    again, created_again = sessions.create_if_absent(
        session_id=session_id, org_id="o", user_id="u", mode="support", now=FIXED_NOW + timedelta(seconds=5)
    )
    assert (created, created_again) == (True, False)
    assert (first.mode, again.mode) == ("general", "general")
    stored = sessions.get(session_id)
    assert stored is not None
    assert (stored.mode, stored.version, stored.created_at) == ("general", 1, FIXED_NOW)


def _turn(turns: TurnRepository, session_id: str) -> str:
    return new_turn(turns, session_id=session_id)


def _commit(turns: TurnRepository, turn_id: str, *, status: TurnStatus, seconds: int) -> bool:
    outcome = TurnOutcome(
        status=status,
        mode="general",
        output_text="a",
        pending_tool_calls=[],
        mode_changes=[],
        error=None,
        usage=Usage(),
        trace=[],
    )
    return turns.commit(
        turn_id, outcome, transcript=[("user", "q"), ("assistant", "a")], snapshot={},
        now=FIXED_NOW + timedelta(seconds=seconds),
    )  # fmt: skip


def test_the_commit_of_a_turn_is_its_sessions_last_use(database_url: str) -> None:
    db = session_factory(create_db_engine(database_url))
    sessions, turns = SessionRepository(db), TurnRepository(db)
    session_id = _session_id()
    sessions.create_if_absent(session_id=session_id, org_id="o", user_id="u", mode="general", now=FIXED_NOW)
    turn_id = _turn(turns, session_id)

    assert _commit(turns, turn_id, status=TurnStatus.COMPLETED, seconds=7)
    touched = sessions.get(session_id)
    assert touched is not None and touched.updated_at == FIXED_NOW + timedelta(seconds=7)

    # A turn already ended leaves everything as it was, its session included.
    assert not _commit(turns, turn_id, status=TurnStatus.FAILED, seconds=9)
    untouched = sessions.get(session_id)
    assert untouched is not None and untouched.updated_at == FIXED_NOW + timedelta(seconds=7)


def test_start_starts_a_queued_turn_once_and_returns_its_record_from_the_same_statement(database_url: str) -> None:
    turns = TurnRepository(session_factory(create_db_engine(database_url)))
    turn_id, later = _turn(turns, _session_id()), FIXED_NOW + timedelta(seconds=5)
    # A queued turn is started, its deadline pushed, and its record is the one it now has
    start = turns.start(turn_id, now=later, deadline_at=later + timedelta(seconds=60))
    assert start is not None and start.turn == turns.get(turn_id)
    started = start.turn
    assert (started.status, started.request, started.deadline_at) == (
        TurnStatus.RUNNING, {"input": "q"}, later + timedelta(seconds=60)
    )  # fmt: skip
    # A turn that started already, one that ended and one that does not exist are not started again
    assert turns.start(turn_id, now=later, deadline_at=later) is None
    assert _commit(turns, turn_id, status=TurnStatus.COMPLETED, seconds=9)
    assert turns.start(turn_id, now=later, deadline_at=later) is None
    assert turns.start(f"turn_{uuid.uuid4().hex}", now=later, deadline_at=later) is None
    ended = turns.get(turn_id)
    assert ended is not None and ended.status is TurnStatus.COMPLETED


def test_a_turns_start_creates_its_new_session_in_the_same_statement(database_url: str) -> None:
    db = session_factory(create_db_engine(database_url))
    check_a_start_creates_a_new_sessions_row_in_its_mode(TurnRepository(db), SessionRepository(db))


def test_a_worker_engine_without_pre_ping_fails_once_then_reconnects_every_connection(database_url: str) -> None:
    engine = create_db_engine(database_url, pool_size=3, pre_ping=False)
    held = [engine.connect() for _ in range(3)]
    pids = {connection.execute(text("SELECT pg_backend_pid()")).scalar_one() for connection in held}
    for connection in held:
        connection.close()  # back to the pool, open
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises(OperationalError), engine.connect() as connection:
        connection.execute(text("SELECT 1"))  # the driver runs such a step again later
    # One dropped connection discards the pool's older ones: no second failure.
    new_pids = set()
    for _ in range(3):
        with engine.connect() as connection:
            new_pids.add(connection.execute(text("SELECT pg_backend_pid()")).scalar_one())
    assert not new_pids & pids
    engine.dispose()


def test_accepting_tool_results_appends_each_paused_round(database_url: str) -> None:
    # Given a turn that pauses twice for client calls
    turns = TurnRepository(session_factory(create_db_engine(database_url)))
    turn_id = _turn(turns, _session_id())
    later = FIXED_NOW + timedelta(seconds=60)
    for round_, call_id in enumerate(("call_a", "call_b")):
        outcome = TurnOutcome(
            status=TurnStatus.REQUIRES_CLIENT_TOOLS, mode="general", output_text=f"text {round_}",
            pending_tool_calls=[PendingToolCall(call_id=call_id, name="open_file", arguments="{}")], mode_changes=[],
            error=None, usage=Usage(llm_calls=round_ + 1), trace=[],
        )  # fmt: skip
        assert turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=FIXED_NOW)
        # When each pause's results are accepted
        results = [{"call_id": call_id, "output": "x"}]
        assert turns.accept_tool_results(turn_id, results=results, now=FIXED_NOW, deadline_at=later) == round_ + 1
    # Then both rounds are kept, in order, as each stood at its pause
    record = turns.get(turn_id)
    assert record is not None and record.round == 2
    assert [(entry["round"], entry["output_text"], entry["usage"]["llm_calls"]) for entry in record.paused_rounds] == [
        (0, "text 0", 1), (1, "text 1", 2)
    ]  # fmt: skip
    assert [entry["pending_tool_calls"][0]["call_id"] for entry in record.paused_rounds] == ["call_a", "call_b"]


@pytest.mark.parametrize(
    ("same_key", "same_request", "same_session", "outcome"),
    [
        (True, True, False, "the earlier turn"),
        (True, False, False, "IdempotencyConflict"),
        (False, True, True, "SessionBusy"),
    ],
)
def test_a_turn_recorded_while_another_holds_its_key_or_session_gets_what_the_first_committed(
    database_url: str, same_key: bool, same_request: bool, same_session: bool, outcome: str
) -> None:
    # Given a turn written but not committed: the gateway is sending its first step
    first_db = session_factory(create_db_engine(database_url))
    racer_name = f"aptix-race {uuid.uuid4().hex[:8]}"
    second_engine = create_db_engine(database_url, application_name=racer_name)
    key = f"key-{uuid.uuid4().hex}"
    first = NewTurn(
        turn_id=f"turn_{uuid.uuid4().hex}", session_id=_session_id(), org_id="o", user_id="u", new_session=True,
        requested_mode=None, request={"input": "q"}, request_hash="h", idempotency_key=key,
    )  # fmt: skip
    second = replace(
        first, turn_id=f"turn_{uuid.uuid4().hex}", idempotency_key=key if same_key else None,
        request_hash="h" if same_request else "other", session_id=first.session_id if same_session else _session_id(),
    )  # fmt: skip
    seen_by_block: list[bool] = []
    result: list[object] = []

    def record_second() -> None:
        turns = TurnRepository(session_factory(second_engine))
        try:
            with turns.creating(second, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60)) as created:
                seen_by_block.append(created.new)
            result.append(created.turn.turn_id)
        except (IdempotencyConflict, SessionBusy) as exc:
            result.append(type(exc).__name__)

    racer = threading.Thread(target=record_second)
    with TurnRepository(first_db).creating(first, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60)) as mine:
        assert mine.new
        # When a second request finds no committed key and its INSERT waits on the first's row
        racer.start()
        with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
            wait_for(
                lambda: admin.execute(waiting, (racer_name,)).fetchone() == (1,),
                what="the second INSERT to wait on the first turn's row",
            )
    racer.join(timeout=30)
    second_engine.dispose()

    # Then the second gets what the first committed: its turn for the same request, with nothing to
    # send (the block saw new=False), or the refusal the write would have met had it come later
    expected = first.turn_id if outcome == "the earlier turn" else outcome
    assert result == [expected]
    assert seen_by_block == ([False] if outcome == "the earlier turn" else [])
    assert TurnRepository(first_db).get(second.turn_id) is None
