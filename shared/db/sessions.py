"""SessionRepository: sessions and their mode history (the session manager of AGN-011 §3.2)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Connection, Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.dml import ReturningInsert

from shared.db.engine import one_statement
from shared.db.tables import ModeHistoryRow, SessionRow

__all__ = ["ModeHistoryRecord", "SessionRecord", "SessionRepository", "insert_session"]

_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_CREATE: dict[str, ReturningInsert[tuple[str]]] = {}
"""Per dialect, built once (see ``shared.db.turn_sql``: a statement built per call recomputes its cache key)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """An agent session as recorded: its authoritative current mode."""

    session_id: str
    org_id: str
    user_id: str
    mode: str
    version: int
    """Bumped by every mode change."""
    created_at: datetime
    updated_at: datetime
    """The session's last use: its creation, a mode change or a turn's commit."""
    client_metadata: dict[str, str] | None = None
    """The client's own string values for the session (an OpenAI conversation's ``metadata``), or None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeHistoryRecord:
    """One mode transition of a session, as recorded."""

    history_id: int
    session_id: str
    turn_id: str
    seq: int
    """Order of the change within its turn."""
    from_mode: str | None
    to_mode: str
    reason: str | None
    org_id: str
    user_id: str
    at: datetime


class SessionRepository:
    """Reads and writes of the session aggregate."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def get(self, session_id: str, *, org_id: str | None = None) -> SessionRecord | None:
        """The session, scoped to ``org_id`` when given."""
        with self._db() as orm:
            row = orm.get(SessionRow, session_id)
        if row is None or (org_id is not None and row.org_id != org_id):
            return None
        return _record(SessionRecord, row)

    def create_if_absent(
        self, *, session_id: str, org_id: str, user_id: str, mode: str, now: datetime
    ) -> tuple[SessionRecord, bool]:
        """Create the session unless it exists (a redelivered creator step finds it).

        One statement, ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, its own transaction (one round trip
        on PostgreSQL: ``one_statement``); a second read only when the session was there already.

        Returns:
            The session and whether this call created it.
        """
        with one_statement(self._db) as conn:
            created = insert_session(conn, session_id=session_id, org_id=org_id, user_id=user_id, mode=mode, now=now)
        if created:
            record = SessionRecord(
                session_id=session_id, org_id=org_id, user_id=user_id, mode=mode, version=1, created_at=now,
                updated_at=now,
            )  # fmt: skip
            return record, True
        existing = self.get(session_id)
        if existing is None:  # deleted between the two statements; nothing deletes sessions today
            raise LookupError(f"session {session_id!r} vanished while it was being created")
        return existing, False

    def set_mode(
        self,
        session_id: str,
        *,
        turn_id: str,
        seq: int,
        from_mode: str | None,
        to_mode: str,
        reason: str | None,
        org_id: str,
        user_id: str,
        now: datetime,
    ) -> bool:
        """SetSessionModeAsync: persist a mode change and its ModeHistory row, atomically.

        ``(turn_id, seq)`` identifies the change; recording it again is a no-op.

        Returns:
            Whether this call recorded the change.
        """
        with self._db.begin() as orm:
            seen = orm.scalar(
                select(ModeHistoryRow.history_id).where(ModeHistoryRow.turn_id == turn_id, ModeHistoryRow.seq == seq)
            )
            if seen is not None:
                return False
            session = orm.get(SessionRow, session_id, with_for_update=True)
            if session is None:
                return False
            session.mode = to_mode
            session.version += 1
            session.updated_at = now
            orm.add(
                ModeHistoryRow(
                    session_id=session_id,
                    turn_id=turn_id,
                    seq=seq,
                    from_mode=from_mode,
                    to_mode=to_mode,
                    reason=reason,
                    org_id=org_id,
                    user_id=user_id,
                    at=now,
                )
            )
        return True

    def mode_history(self, session_id: str) -> list[ModeHistoryRecord]:
        """The session's mode transitions, oldest first."""
        with self._db() as orm:
            rows = orm.scalars(
                select(ModeHistoryRow)
                .where(ModeHistoryRow.session_id == session_id)
                .order_by(ModeHistoryRow.at, ModeHistoryRow.history_id)
            )
            return [_record(ModeHistoryRecord, row) for row in rows]


_Record = TypeVar("_Record", SessionRecord, ModeHistoryRecord)


def _record(record: type[_Record], row: SessionRow | ModeHistoryRow) -> _Record:
    """The record of ``row``: the record's fields are the row's columns."""
    return record(**{field.name: getattr(row, field.name) for field in fields(record)})


def insert_session(conn: Connection, *, session_id: str, org_id: str, user_id: str, mode: str, now: datetime) -> bool:
    """Insert a new session's row on ``conn`` unless one exists (``INSERT ... ON CONFLICT DO NOTHING``); whether it
    did. Its transaction is the caller's."""
    values = {"p_session_id": session_id, "p_org_id": org_id, "p_user_id": user_id, "p_mode": mode, "p_now": now}
    return conn.execute(_create_statement(conn.dialect.name), values).scalar_one_or_none() is not None


def _create_statement(name: str) -> ReturningInsert[tuple[str]]:
    statement = _CREATE.get(name)
    if statement is None:
        dialect = postgresql if name == "postgresql" else sqlite
        statement = _CREATE[name] = (
            dialect.insert(_SESSIONS)
            .values(
                session_id=bindparam("p_session_id"), org_id=bindparam("p_org_id"), user_id=bindparam("p_user_id"),
                mode=bindparam("p_mode"), version=1, created_at=bindparam("p_now"), updated_at=bindparam("p_now"),
            )
            .on_conflict_do_nothing(index_elements=["session_id"])
            .returning(_SESSIONS.c.session_id)
        )  # fmt: skip
    return statement
