"""SessionRepository: sessions and their mode history (the session manager of AGN-011 §3.2)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Table, bindparam, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.dml import ReturningInsert

from shared.db.tables import ModeHistoryRow, SessionRow

__all__ = ["SessionRepository"]

_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_CREATE: dict[str, ReturningInsert[tuple[str]]] = {}
"""Per dialect, built once (see ``shared.db.turns``: a statement built per call recomputes its cache key)."""


class SessionRepository:
    """Reads and writes of the session aggregate."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def get(self, session_id: str, *, org_id: str | None = None) -> SessionRow | None:
        """The session, scoped to ``org_id`` when given."""
        with self._sessions() as db:
            row = db.get(SessionRow, session_id)
        if row is None or (org_id is not None and row.org_id != org_id):
            return None
        return row

    def create_if_absent(
        self, *, session_id: str, org_id: str, user_id: str, mode: str, now: datetime
    ) -> tuple[SessionRow, bool]:
        """Create the session unless it exists (a redelivered creator step finds it).

        One statement, ``INSERT ... ON CONFLICT DO NOTHING RETURNING``, in one transaction; a second
        read only when the session was there already.

        Returns:
            The session and whether this call created it.
        """
        values = {"p_session_id": session_id, "p_org_id": org_id, "p_user_id": user_id, "p_mode": mode, "p_now": now}
        with self._sessions.begin() as db:
            created = db.execute(_create_statement(db), values).scalar_one_or_none() is not None
        if created:
            row = SessionRow(
                session_id=session_id, org_id=org_id, user_id=user_id, mode=mode, version=1, created_at=now,
                updated_at=now,
            )  # fmt: skip
            return row, True
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
        with self._sessions.begin() as db:
            seen = db.scalar(
                select(ModeHistoryRow.history_id).where(ModeHistoryRow.turn_id == turn_id, ModeHistoryRow.seq == seq)
            )
            if seen is not None:
                return False
            session = db.get(SessionRow, session_id, with_for_update=True)
            if session is None:
                return False
            session.mode = to_mode
            session.version += 1
            session.updated_at = now
            db.add(
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

    def mode_history(self, session_id: str) -> list[ModeHistoryRow]:
        """The session's mode transitions, oldest first."""
        with self._sessions() as db:
            return list(
                db.scalars(
                    select(ModeHistoryRow)
                    .where(ModeHistoryRow.session_id == session_id)
                    .order_by(ModeHistoryRow.at, ModeHistoryRow.history_id)
                )
            )


def _create_statement(db: Session) -> ReturningInsert[tuple[str]]:
    name = db.get_bind().dialect.name
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
