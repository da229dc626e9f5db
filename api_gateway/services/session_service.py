"""SessionService: a session as the caller sees it — its mode, mode history and turns."""

from __future__ import annotations

from api_gateway.ids import is_session_id
from api_gateway.services.errors import NotFound
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.models.session import ModeHistoryEntry, Session, SessionTurnSummary
from shared.models.turn import TurnStatus
from shared.modes import ModeCatalog

__all__ = ["SessionService"]


class SessionService:
    """Read sessions; built once per gateway from its repositories."""

    def __init__(self, *, sessions: SessionRepository, turns: TurnRepository, catalog: ModeCatalog) -> None:
        self._sessions = sessions
        self._turns = turns
        self._catalog = catalog

    def get(self, session_id: str, *, org_id: str) -> Session:
        """The caller's session with its mode history and its turns, oldest first.

        A session exists from the moment ``POST /v1/turns`` answered with its id: until its first
        turn's session step has run, it is read from that turn (its requested or the default mode,
        no history).

        Raises:
            NotFound: ``session_not_found``, when no session ``session_id`` belongs to ``org_id``.
        """
        if not is_session_id(session_id):
            raise NotFound("session_not_found", f"session {session_id!r} does not exist")
        row = self._sessions.get(session_id, org_id=org_id)
        turns = self._turns.for_session(session_id)
        turn_summaries = [
            SessionTurnSummary(turn_id=t.turn_id, status=TurnStatus(t.status), created_at=t.created_at) for t in turns
        ]
        if row is None:
            # The session's row is written by its first turn's session step, on a worker; the id was
            # handed out when that turn was recorded, and is the caller's from then on.
            first = turns[0] if turns else None
            if first is None or first.org_id != org_id or not first.new_session:
                raise NotFound("session_not_found", f"session {session_id!r} does not exist")
            return Session(
                session_id=session_id,
                mode=self._catalog.get_or_default(first.requested_mode).name,
                created_at=first.created_at,
                updated_at=first.created_at,
                mode_history=[],
                turns=turn_summaries,
            )
        history = self._sessions.mode_history(session_id)
        return Session(
            session_id=row.session_id,
            mode=row.mode,
            created_at=row.created_at,
            updated_at=row.updated_at,
            mode_history=[
                ModeHistoryEntry(
                    from_mode=h.from_mode,
                    to_mode=h.to_mode,
                    at=h.at,
                    reason=h.reason,
                    user_id=h.user_id,
                    turn_id=h.turn_id,
                )
                for h in history
            ],
            turns=turn_summaries,
        )
