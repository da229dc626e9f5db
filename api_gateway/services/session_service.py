"""SessionService: a session as the caller sees it — its mode, mode history and turns."""

from __future__ import annotations

from api_gateway.ids import is_session_id
from api_gateway.services.errors import NotFound
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.models.session import ModeHistoryEntry, Session, SessionTurnSummary
from shared.models.turn import TurnStatus

__all__ = ["SessionService"]


class SessionService:
    """Read sessions; built once per gateway from its repositories."""

    def __init__(self, *, sessions: SessionRepository, turns: TurnRepository) -> None:
        self._sessions = sessions
        self._turns = turns

    def get(self, session_id: str, *, org_id: str) -> Session:
        """The caller's session with its mode history and its turns, oldest first.

        Raises:
            NotFound: ``session_not_found``, when no session ``session_id`` belongs to ``org_id``.
        """
        row = self._sessions.get(session_id, org_id=org_id) if is_session_id(session_id) else None
        if row is None:
            raise NotFound("session_not_found", f"session {session_id!r} does not exist")
        history = self._sessions.mode_history(session_id)
        turns = self._turns.for_session(session_id)
        return Session(
            session_id=row.session_id,
            mode=row.mode,
            created_at=row.created_at,
            updated_at=row.updated_at,
            mode_history=[
                ModeHistoryEntry(
                    from_mode=h.from_mode, to_mode=h.to_mode, at=h.at, reason=h.reason, user_id=h.user_id,
                    turn_id=h.turn_id,
                )
                for h in history
            ],
            turns=[
                SessionTurnSummary(turn_id=t.turn_id, status=TurnStatus(t.status), created_at=t.created_at)
                for t in turns
            ],
        )
