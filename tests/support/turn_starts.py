"""What a turn's start writes (``TurnRepository.start``), the same on SQLite and on PostgreSQL: a new session's turn
creates its session in the start's own write, its mode by the catalog's rule; nothing else does."""

from __future__ import annotations

import uuid
from datetime import timedelta

from shared.db.sessions import SessionRepository
from shared.db.turn_sql import SessionModes
from shared.db.turns import NewTurn, TurnRepository
from tests.unit.fakes import FIXED_NOW

MODES = SessionModes(known=("general", "research"), default="general")
LATER = FIXED_NOW + timedelta(seconds=5)


def new_turn(turns: TurnRepository, *, session_id: str, new_session: bool = True, requested: str | None = None) -> str:
    """Record a queued turn of ``session_id`` (created at ``FIXED_NOW``, a minute's deadline); its id."""
    turn_id = f"turn_{uuid.uuid4().hex}"
    turns.create(
        NewTurn(turn_id=turn_id, session_id=session_id, org_id="o", user_id="u", new_session=new_session,
                requested_mode=requested, request={"input": "q"}, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    return turn_id


def _session() -> str:
    return f"sess_{uuid.uuid4().hex}"


def check_a_start_creates_a_new_sessions_row_in_its_mode(turns: TurnRepository, sessions: SessionRepository) -> None:
    """Asserts what each kind of start writes; raises AssertionError on the first that differs."""
    for requested, mode in ((None, "general"), ("research", "research"), ("left-the-catalog", "general")):
        session_id = _session()
        turn_id = new_turn(turns, session_id=session_id, requested=requested)
        started = turns.start(turn_id, now=LATER, deadline_at=LATER + timedelta(seconds=60), modes=MODES)
        assert started is not None and started.created_mode == mode, (requested, started)
        assert started.turn == turns.get(turn_id) and started.turn.status.value == "running"
        row = sessions.get(session_id)
        assert row is not None and (row.mode, row.org_id, row.user_id, row.created_at) == (mode, "o", "u", LATER)
        # started already: nothing is written again
        assert turns.start(turn_id, now=LATER, deadline_at=LATER, modes=MODES) is None

    # a follow-up turn (its session exists, new_session false) creates none and leaves the session as it was
    session_id = _session()
    sessions.create_if_absent(session_id=session_id, org_id="o", user_id="u", mode="research", now=FIXED_NOW)
    follow_up = turns.start(new_turn(turns, session_id=session_id, new_session=False), now=LATER, deadline_at=LATER,
                            modes=MODES)  # fmt: skip
    assert follow_up is not None and follow_up.created_mode is None
    # a new session's turn whose session is there already (its start ran before, and the state was lost) keeps it
    session_id = _session()
    sessions.create_if_absent(session_id=session_id, org_id="o", user_id="u", mode="research", now=FIXED_NOW)
    again = turns.start(new_turn(turns, session_id=session_id), now=LATER, deadline_at=LATER, modes=MODES)
    assert again is not None and again.created_mode is None
    kept = sessions.get(session_id)
    assert kept is not None and (kept.mode, kept.created_at) == ("research", FIXED_NOW)
    # without the modes, a start creates no session
    session_id = _session()
    plain = turns.start(new_turn(turns, session_id=session_id), now=LATER, deadline_at=LATER)
    assert plain is not None and plain.created_mode is None and sessions.get(session_id) is None
