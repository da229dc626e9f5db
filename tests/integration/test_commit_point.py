"""The commit point writes the same rows on PostgreSQL, where it is one statement in one round trip
(issue 28), as on SQLite, where it is a transaction: the turn's outcome, its transcript (replaced
whole), its snapshot and its session's last use; only when the turn had not ended otherwise; the
same again when run twice. With webhooks for the turn's organisation it stays a transaction (its
outbox row is written in it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.pool import StaticPool

from shared.db.engine import normalise_database_url, session_factory
from shared.db.sessions import SessionRepository
from shared.db.tables import TranscriptItemRow
from shared.db.turns import NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import PendingToolCall, TurnStatus, Usage
from shared.webhooks import WebhookConfig
from tests.support.pg_trace import traced
from tests.unit.fakes import FIXED_NOW, sqlite_engine

pytestmark = pytest.mark.integration


@dataclass
class _Db:
    engine: Engine
    turns: TurnRepository
    sessions: SessionRepository
    turn_id: str
    session_id: str


@pytest.fixture(params=["postgresql", "sqlite"])
def db(request: pytest.FixtureRequest) -> Iterator[_Db]:
    """A running turn in a session of its own, on each database (PostgreSQL on one traceable connection)."""
    engine: Engine = (
        create_engine(normalise_database_url(request.getfixturevalue("database_url")), poolclass=StaticPool)
        if request.param == "postgresql"
        else sqlite_engine()
    )
    yield _started(engine, TurnRepository(session_factory(engine)))
    engine.dispose()


def _started(engine: Engine, turns: TurnRepository, *, org_id: str = "o") -> _Db:
    sessions = SessionRepository(session_factory(engine))
    turn_id, session_id = f"turn_{uuid.uuid4().hex}", f"sess_{uuid.uuid4().hex}"
    sessions.create_if_absent(session_id=session_id, org_id=org_id, user_id="u", mode="general", now=FIXED_NOW)
    turns.create(
        NewTurn(turn_id=turn_id, session_id=session_id, org_id=org_id, user_id="u", new_session=False,
                requested_mode=None, request={"input": "q"}, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    turns.mark_running(turn_id, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    return _Db(engine, turns, sessions, turn_id, session_id)


def _outcome(status: TurnStatus, text: str) -> TurnOutcome:
    paused = status is TurnStatus.REQUIRES_CLIENT_TOOLS
    pending = [PendingToolCall(call_id="c1", name="lookup", arguments="{}")] if paused else []
    return TurnOutcome(
        status=status, mode="general", output_text=text, pending_tool_calls=pending, mode_changes=[], error=None,
        usage=Usage(input_tokens=3, output_tokens=4), trace=[],
    )  # fmt: skip


def _commit(db: _Db, status: TurnStatus, text: str, transcript: list[tuple[str, str]], *, at: int) -> bool:
    committed = db.turns.commit(
        db.turn_id, _outcome(status, text), transcript=transcript, snapshot={"status": status.value, "text": text},
        now=FIXED_NOW + timedelta(seconds=at), org_id="o",
    )  # fmt: skip
    return committed is not None


def _rows(db: _Db) -> dict[str, Any]:
    """Everything a commit writes, as the database holds it."""
    record = db.turns.get(db.turn_id)
    session = db.sessions.get(db.session_id)
    assert record is not None and session is not None
    with db.engine.connect() as conn:
        items = conn.execute(
            select(TranscriptItemRow.session_id, TranscriptItemRow.seq, TranscriptItemRow.role,
                   TranscriptItemRow.content, TranscriptItemRow.created_at)
            .where(TranscriptItemRow.turn_id == db.turn_id).order_by(TranscriptItemRow.seq)
        ).all()  # fmt: skip
    return {
        "status": record.status,
        "output": record.output_text,
        "pending": [call["call_id"] for call in record.pending_tool_calls],
        "usage": (record.usage["input_tokens"], record.usage["output_tokens"]),
        "deadline_at": record.deadline_at,
        "completed_at": record.completed_at,
        "transcript": [tuple(item) for item in items],
        "snapshot": db.turns.load_snapshot(db.turn_id),
        "session_used": session.updated_at,
    }


def _at(seconds: int) -> datetime:
    return FIXED_NOW + timedelta(seconds=seconds)


def test_a_turn_pauses_completes_and_commits_again_with_the_same_rows(db: _Db) -> None:
    # When the turn pauses for a client tool (no transcript yet)
    assert _commit(db, TurnStatus.REQUIRES_CLIENT_TOOLS, "", [], at=5)
    # Then its row, snapshot and session say so, and it has no transcript
    paused = _rows(db)
    assert (paused["status"], paused["pending"], paused["transcript"]) == (TurnStatus.REQUIRES_CLIENT_TOOLS, ["c1"], [])
    assert paused["snapshot"] == {"status": "requires_client_tools", "text": ""}
    assert paused["session_used"] == _at(5) and paused["completed_at"] is None

    # When it completes
    assert _commit(db, TurnStatus.COMPLETED, "the answer", [("user", "q"), ("assistant", "the answer")], at=9)
    done = _rows(db)
    assert (done["status"], done["output"], done["pending"], done["usage"]) == (
        TurnStatus.COMPLETED, "the answer", [], (3, 4)
    )  # fmt: skip
    assert done["transcript"] == [
        (db.session_id, 0, "user", "q", _at(9)),
        (db.session_id, 1, "assistant", "the answer", _at(9)),
    ]
    assert done["snapshot"] == {"status": "completed", "text": "the answer"}
    assert (done["deadline_at"], done["completed_at"], done["session_used"]) == (None, _at(9), _at(9))

    # When the same commit runs again (its message delivered twice), the rows are the same
    assert _commit(db, TurnStatus.COMPLETED, "the answer", [("user", "q"), ("assistant", "the answer")], at=9)
    assert _rows(db) == done


def test_a_commit_after_the_turn_ended_otherwise_writes_nothing(db: _Db) -> None:
    # Given the turn completed
    assert _commit(db, TurnStatus.COMPLETED, "the answer", [("user", "q"), ("assistant", "the answer")], at=9)
    done = _rows(db)
    # When a late commit of another status comes (a stale worker's failure, say)
    written = _commit(db, TurnStatus.FAILED, "", [], at=12)
    # Then nothing changed: not the row, the transcript, the snapshot or the session
    assert not written
    assert _rows(db) == done


def test_a_commit_replaces_the_whole_transcript(db: _Db) -> None:
    # Given a commit wrote two items
    assert _commit(db, TurnStatus.REQUIRES_CLIENT_TOOLS, "", [("user", "q"), ("assistant", "first")], at=5)
    # When the next commit of the turn has one item, then none
    assert _commit(db, TurnStatus.REQUIRES_CLIENT_TOOLS, "", [("user", "q2")], at=6)
    one = _rows(db)["transcript"]
    assert _commit(db, TurnStatus.REQUIRES_CLIENT_TOOLS, "", [], at=7)
    # Then each replaced the items before it
    assert one == [(db.session_id, 0, "user", "q2", _at(6))]
    assert _rows(db)["transcript"] == []


def test_a_commit_on_postgresql_is_one_round_trip_unless_it_records_a_webhook(database_url: str) -> None:
    engine = create_engine(normalise_database_url(database_url), poolclass=StaticPool)
    config = WebhookConfig(secrets={"hooked": b"0123456789abcdef0123"}, default_urls={"hooked": "https://h.example/in"})
    turns = TurnRepository(session_factory(engine), webhooks=WebhookOutbox(config))
    try:
        # Given a running turn of an organisation without webhooks, on one connection libpq traces
        db = _started(engine, turns)
        # When it commits
        with traced(engine) as sent:
            assert _commit(db, TurnStatus.COMPLETED, "the answer", [("user", "q"), ("assistant", "the answer")], at=9)
        # Then the client sent one statement and waited once (no BEGIN, no COMMIT)
        assert (sent.round_trips, sent.transactions) == (1, 0), sent.messages
        assert len(_rows(db)["transcript"]) == 2

        # And a turn of an organisation with webhooks commits in a transaction that records its event
        hooked = _started(engine, turns, org_id="hooked")
        with traced(engine) as sent:
            committed = turns.commit(
                hooked.turn_id, _outcome(TurnStatus.COMPLETED, "a"), transcript=[("user", "q"), ("assistant", "a")],
                snapshot={}, now=_at(9), org_id="hooked",
            )  # fmt: skip
        assert committed is not None and len(committed.deliveries) == 1
        assert sent.transactions == 1 and any("COMMIT" in query for query in sent.queries), sent.messages
        assert _rows(hooked)["status"] == TurnStatus.COMPLETED
    finally:
        engine.dispose()
