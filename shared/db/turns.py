"""TurnRepository: turns, their transcript items and provider-state snapshots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, delete, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert, ReturningUpdate, Update
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import ProviderSnapshotRow, SessionRow, TranscriptItemRow, TurnRow
from shared.models.turn import UNFINISHED_STATUSES, ModeChange, PendingToolCall, Turn, TurnStatus, Usage
from shared.result import ErrorInfo

__all__ = [
    "IdempotencyConflict",
    "InFlightTurn",
    "NewTurn",
    "SessionBusy",
    "TurnRepository",
    "new_turn_row",
    "to_turn",
]

TERMINAL = (TurnStatus.COMPLETED.value, TurnStatus.FAILED.value, TurnStatus.CANCELLED.value)
IN_FLIGHT = (TurnStatus.QUEUED.value, TurnStatus.RUNNING.value)

# The statements of the hot path, built once: a statement object built per call makes SQLAlchemy
# compute its cache key again each time (measured: a third of a checkpoint's CPU).
_TURNS: Table = TurnRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_SNAPSHOTS: Table = ProviderSnapshotRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_START: Update = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), _TURNS.c.status.notin_(TERMINAL))
    .values(status=TurnStatus.RUNNING.value, updated_at=bindparam("p_now"), deadline_at=bindparam("p_deadline"))
)
_PUSH_DEADLINE: Update = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), _TURNS.c.status == TurnStatus.RUNNING.value)
    .values(deadline_at=bindparam("p_deadline"), updated_at=bindparam("p_now"))
)
_SET_DEADLINE: Update = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), or_(*(_TURNS.c.status == status for status in IN_FLIGHT)))
    .values(deadline_at=bindparam("p_deadline"))
)
"""The reconciler's move of a turn still moving (one executemany per scan batch: hence no ``IN``,
which SQLAlchemy expands per call)."""
_OVERDUE = (
    select(_TURNS.c.turn_id, _TURNS.c.status, _TURNS.c.round, _TURNS.c.batch_id, _TURNS.c.redrives)
    .where(_TURNS.c.status.in_(IN_FLIGHT), _TURNS.c.deadline_at < bindparam("p_now"))
    .order_by(_TURNS.c.deadline_at)
    .limit(bindparam("p_limit"))
)
_UPSERT_SNAPSHOT: dict[str, Insert] = {}
_TRANSCRIPT: Table = TranscriptItemRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_FINISH_VALUES: dict[str, BindParameter[Any]] = {
    name: bindparam(f"p_{name}")
    for name in (
        "status", "mode", "output_text", "pending_tool_calls", "mode_changes", "error", "usage", "trace",
        "updated_at", "completed_at",
    )
}  # fmt: skip
_FINISH_WHERE = (
    _TURNS.c.turn_id == bindparam("p_turn_id"),
    or_(_TURNS.c.status.notin_(TERMINAL), _TURNS.c.status == bindparam("p_status")),
)
_FINISH: ReturningUpdate[tuple[str]] = (
    update(_TURNS).where(*_FINISH_WHERE).values({**_FINISH_VALUES, "deadline_at": None}).returning(_TURNS.c.session_id)
)
"""The commit of a turn that leaves the in-flight statuses (its deadline goes); returns its session."""
_FINISH_IN_FLIGHT: ReturningUpdate[tuple[str]] = (
    update(_TURNS).where(*_FINISH_WHERE).values(_FINISH_VALUES).returning(_TURNS.c.session_id)
)
_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_TOUCH_SESSION = (
    update(_SESSIONS).where(_SESSIONS.c.session_id == bindparam("p_session_id")).values(updated_at=bindparam("p_now"))
)
"""A turn's commit is its session's last use."""
_CLEAR_TRANSCRIPT = delete(_TRANSCRIPT).where(_TRANSCRIPT.c.turn_id == bindparam("p_turn_id"))
_ADD_TRANSCRIPT = insert(_TRANSCRIPT)
UNFINISHED = tuple(status.value for status in UNFINISHED_STATUSES)


class SessionBusy(Exception):
    """The session already has an unfinished turn."""


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request."""


@dataclass(frozen=True, slots=True)
class InFlightTurn:
    """What the reconciler needs of a queued or running turn past its deadline."""

    turn_id: str
    status: TurnStatus
    round: int
    batch_id: str | None
    redrives: int


class NewTurn:
    """What the gateway records when it accepts a turn."""

    def __init__(
        self,
        *,
        turn_id: str,
        session_id: str,
        org_id: str,
        user_id: str,
        new_session: bool,
        requested_mode: str | None,
        request: dict[str, Any],
        request_hash: str,
        idempotency_key: str | None = None,
        batch_id: str | None = None,
        batch_index: int | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.session_id = session_id
        self.org_id = org_id
        self.user_id = user_id
        self.new_session = new_session
        self.requested_mode = requested_mode
        self.request = request
        self.request_hash = request_hash
        self.idempotency_key = idempotency_key
        self.batch_id = batch_id
        self.batch_index = batch_index


class TurnRepository:
    """Reads and writes of the turn aggregate."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(
        self,
        turn: NewTurn,
        *,
        now: datetime,
        deadline_at: datetime,
        before_commit: Callable[[], None] | None = None,
    ) -> tuple[TurnRow, bool]:
        """Record a queued turn.

        ``before_commit`` runs once the row is written but not yet committed (the gateway enqueues
        the turn there): if it raises, nothing is recorded; if the process dies after it, the
        message finds no turn and is dropped. Either way no turn is left queued with no message.

        Returns:
            The row and whether it was created (False: an earlier turn with the same idempotency key).

        Raises:
            SessionBusy: the session has an unfinished turn.
            IdempotencyConflict: the key was used with a different request.
        """
        if turn.idempotency_key is not None:
            earlier = self._by_idempotency_key(turn.org_id, turn.idempotency_key)
            if earlier is not None:
                return self._same_request(earlier, turn), False
        row = new_turn_row(turn, now=now, deadline_at=deadline_at)
        try:
            with self._sessions.begin() as db:
                db.add(row)
                db.flush()
                if before_commit is not None:
                    before_commit()
        except IntegrityError as exc:
            if turn.idempotency_key is not None:
                earlier = self._by_idempotency_key(turn.org_id, turn.idempotency_key)
                if earlier is not None:
                    return self._same_request(earlier, turn), False
            raise SessionBusy(turn.session_id) from exc
        return row, True

    def get(self, turn_id: str, *, org_id: str | None = None) -> TurnRow | None:
        """The turn, scoped to ``org_id`` when given."""
        with self._sessions() as db:
            row = db.get(TurnRow, turn_id)
        if row is None or (org_id is not None and row.org_id != org_id):
            return None
        return row

    def for_session(self, session_id: str) -> list[TurnRow]:
        """The session's turns, oldest first."""
        with self._sessions() as db:
            return list(
                db.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.created_at))
            )

    def mark_running(self, turn_id: str, *, now: datetime, deadline_at: datetime) -> bool:
        """Move a queued turn to running (the turn's start); False when it already finished (e.g. cancelled)."""
        with self._sessions.begin() as db:
            result = db.execute(_START, {"p_turn_id": turn_id, "p_now": now, "p_deadline": deadline_at})
        return bool(result.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def checkpoint(self, turn_id: str, state: dict[str, Any], *, now: datetime, deadline_at: datetime) -> None:
        """Keep ``state`` as the turn's newest durable checkpoint and push its deadline (one transaction)."""
        with self._sessions.begin() as db:
            _upsert_snapshot(db, turn_id, state, now=now)
            db.execute(_PUSH_DEADLINE, {"p_turn_id": turn_id, "p_deadline": deadline_at, "p_now": now})

    def overdue(self, *, now: datetime, limit: int = 500) -> list[InFlightTurn]:
        """Queued or running turns whose deadline passed, the most overdue first."""
        with self._sessions() as db:
            rows = db.execute(_OVERDUE, {"p_now": now, "p_limit": limit}).all()
        return [InFlightTurn(r.turn_id, TurnStatus(r.status), r.round, r.batch_id, r.redrives) for r in rows]

    def set_deadlines(self, deadlines: dict[str, datetime]) -> None:
        """Move the deadlines of turns that are still in flight (one transaction)."""
        if not deadlines:
            return
        with self._sessions.begin() as db:
            db.execute(_SET_DEADLINE, [{"p_turn_id": turn_id, "p_deadline": at} for turn_id, at in deadlines.items()])

    def note_redrive(self, turn_id: str, *, deadline_at: datetime) -> None:
        """Count one re-drive of the turn and give it a new deadline."""
        with self._sessions.begin() as db:
            db.execute(
                update(TurnRow)
                .where(TurnRow.turn_id == turn_id, TurnRow.status.in_(IN_FLIGHT))
                .values(deadline_at=deadline_at, redrives=TurnRow.redrives + 1)
            )

    def commit(
        self,
        turn_id: str,
        *,
        status: TurnStatus,
        mode: str | None,
        output_text: str | None,
        pending_tool_calls: list[PendingToolCall],
        mode_changes: list[ModeChange],
        error: ErrorInfo | None,
        usage: Usage,
        trace: list[dict[str, Any]],
        transcript: list[tuple[str, str]],
        snapshot: dict[str, Any],
        now: datetime,
    ) -> bool:
        """The commit point: the turn's result, its transcript items, its state snapshot and its session's last use, at once.

        Idempotent: writing the same outcome twice leaves the same rows. A turn that already
        reached a terminal status (cancelled, say) is left as it is.

        Returns:
            False when the turn was already terminal and nothing was written.
        """
        statement = _FINISH_IN_FLIGHT if status.value in IN_FLIGHT else _FINISH
        values = {
            "p_turn_id": turn_id,
            "p_status": status.value,
            "p_mode": mode,
            "p_output_text": output_text,
            "p_pending_tool_calls": [call.model_dump() for call in pending_tool_calls],
            "p_mode_changes": [change.model_dump(by_alias=True) for change in mode_changes],
            "p_error": None if error is None else error.model_dump(mode="json"),
            "p_usage": usage.model_dump(),
            "p_trace": trace,
            "p_updated_at": now,
            "p_completed_at": now if status.value in TERMINAL else None,
        }
        with self._sessions.begin() as db:
            # The UPDATE locks the row until the commit, as SELECT ... FOR UPDATE did; it changes
            # nothing when the turn is unknown or already ended otherwise (cancelled, say).
            session_id = db.execute(statement, values).scalar_one_or_none()
            if session_id is None:
                return False
            db.execute(_CLEAR_TRANSCRIPT, {"p_turn_id": turn_id})
            if transcript:
                items = [
                    {"session_id": session_id, "turn_id": turn_id, "seq": seq, "role": role, "content": content,
                     "created_at": now}
                    for seq, (role, content) in enumerate(transcript)
                ]  # fmt: skip
                db.execute(_ADD_TRANSCRIPT, items)
            _upsert_snapshot(db, turn_id, snapshot, now=now)
            db.execute(_TOUCH_SESSION, {"p_session_id": session_id, "p_now": now})
        return True

    def accept_tool_results(
        self,
        turn_id: str,
        *,
        results: list[dict[str, str]],
        now: datetime,
        deadline_at: datetime,
        before_commit: Callable[[int], None] | None = None,
    ) -> int | None:
        """Move a turn waiting for client tools back to running with the posted results.

        ``before_commit`` gets the new round once the change is written but not committed (the
        gateway enqueues the re-entry there, as for new turns): if it raises, nothing changes.

        Returns:
            The new round number, or None when the turn was not waiting (a concurrent post won).
        """
        with self._sessions.begin() as db:
            row = db.get(TurnRow, turn_id, with_for_update=True)
            if row is None or row.status != TurnStatus.REQUIRES_CLIENT_TOOLS.value:
                return None
            row.round += 1
            row.status = TurnStatus.RUNNING.value
            row.client_tool_results = results
            row.pending_tool_calls = []
            row.updated_at = now
            row.deadline_at = deadline_at
            db.flush()
            if before_commit is not None:
                before_commit(row.round)
            return row.round

    def finish_early(
        self,
        turn_id: str,
        *,
        status: TurnStatus,
        error: ErrorInfo,
        now: datetime,
        only_if: tuple[str, ...] = UNFINISHED,
    ) -> TurnRow | None:
        """End a turn from outside the pipeline (cancel, client-tool timeout) if its status is in ``only_if``.

        Returns:
            The updated row, or None when the turn was not in one of those statuses.
        """
        with self._sessions.begin() as db:
            row = db.get(TurnRow, turn_id, with_for_update=True)
            if row is None or row.status not in only_if:
                return None
            row.status = status.value
            row.error = error.model_dump(mode="json")
            row.pending_tool_calls = []
            row.updated_at = now
            row.completed_at = now
            row.deadline_at = None
            row.trace = [
                *row.trace,
                {"seq": len(row.trace) + 1, "kind": "turn_" + status.value, "at": now.isoformat(), "step": "gateway",
                 "worker": "gateway", "duration_ms": None, "data": {"code": error.code.value, "message": error.message}},
            ]  # fmt: skip
            return row

    def overdue_waiting(self, *, older_than: datetime, session_id: str | None = None, limit: int = 500) -> list[str]:
        """Ids of turns waiting for client tools since before ``older_than``."""
        query = (
            select(TurnRow.turn_id)
            .where(TurnRow.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value)
            .where(TurnRow.updated_at < older_than)
            .limit(limit)
        )
        if session_id is not None:
            query = query.where(TurnRow.session_id == session_id)
        with self._sessions() as db:
            return list(db.scalars(query))

    def load_snapshot(self, turn_id: str) -> dict[str, Any] | None:
        """The state snapshot of the turn's last commit point."""
        with self._sessions() as db:
            row = db.get(ProviderSnapshotRow, turn_id)
        return None if row is None else row.state

    def conversation(self, session_id: str, *, before: datetime, limit: int) -> list[tuple[str, str]]:
        """(role, content) of the session's last ``limit`` completed turns created before ``before``, oldest first."""
        recent = (
            select(TurnRow.turn_id, TurnRow.created_at)
            .where(TurnRow.session_id == session_id)
            .where(TurnRow.status == TurnStatus.COMPLETED.value)
            .where(TurnRow.created_at < before)
            .order_by(TurnRow.created_at.desc())
            .limit(limit)
            .subquery()
        )
        query = (
            select(TranscriptItemRow.role, TranscriptItemRow.content)
            .join(recent, recent.c.turn_id == TranscriptItemRow.turn_id)
            .order_by(recent.c.created_at, TranscriptItemRow.seq)
        )
        with self._sessions() as db:
            return [(role, content) for role, content in db.execute(query).all()]

    def _by_idempotency_key(self, org_id: str, key: str) -> TurnRow | None:
        with self._sessions() as db:
            return db.scalar(select(TurnRow).where(TurnRow.org_id == org_id, TurnRow.idempotency_key == key))

    @staticmethod
    def _same_request(earlier: TurnRow, turn: NewTurn) -> TurnRow:
        if earlier.request_hash != turn.request_hash:
            raise IdempotencyConflict(turn.idempotency_key)
        return earlier



def _upsert_snapshot(db: Session, turn_id: str, state: dict[str, Any], *, now: datetime) -> None:
    """Insert or replace the turn's checkpoint in one statement."""
    name = db.get_bind().dialect.name
    statement = _UPSERT_SNAPSHOT.get(name)
    if statement is None:
        dialect = postgresql if name == "postgresql" else sqlite
        insert = dialect.insert(_SNAPSHOTS).values(
            turn_id=bindparam("p_turn_id"), state=bindparam("p_state"), updated_at=bindparam("p_now")
        )
        # The state goes over the wire (and through the JSON encoder) once: the update takes the
        # row the insert proposed.
        replace = {"state": insert.excluded.state, "updated_at": insert.excluded.updated_at}
        statement = _UPSERT_SNAPSHOT[name] = insert.on_conflict_do_update(index_elements=["turn_id"], set_=replace)
    db.execute(statement, {"p_turn_id": turn_id, "p_state": state, "p_now": now})


def new_turn_row(turn: NewTurn, *, now: datetime, deadline_at: datetime) -> TurnRow:
    """The row of a newly accepted (queued) turn."""
    return TurnRow(
        turn_id=turn.turn_id,
        session_id=turn.session_id,
        org_id=turn.org_id,
        user_id=turn.user_id,
        batch_id=turn.batch_id,
        batch_index=turn.batch_index,
        status=TurnStatus.QUEUED.value,
        new_session=turn.new_session,
        requested_mode=turn.requested_mode,
        mode=None,
        request=turn.request,
        request_hash=turn.request_hash,
        idempotency_key=turn.idempotency_key,
        pending_tool_calls=[],
        mode_changes=[],
        usage=Usage().model_dump(),
        trace=[],
        created_at=now,
        updated_at=now,
        deadline_at=deadline_at,
        redrives=0,
    )


def to_turn(row: TurnRow) -> Turn:
    """The API view of a turn row."""
    return Turn(
        turn_id=row.turn_id,
        session_id=row.session_id,
        batch_id=row.batch_id,
        status=TurnStatus(row.status),
        mode=row.mode if row.mode is not None else row.requested_mode,
        mode_changes=[ModeChange.model_validate(change) for change in row.mode_changes],
        output_text=row.output_text,
        pending_tool_calls=[PendingToolCall.model_validate(call) for call in row.pending_tool_calls],
        error=None if row.error is None else ErrorInfo.model_validate(row.error),
        usage=Usage.model_validate(row.usage),
        created_at=row.created_at,
        completed_at=row.completed_at,
    )
