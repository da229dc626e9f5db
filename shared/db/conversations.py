"""ConversationRepository: a session seen as an OpenAI conversation (its metadata, seed turn and transcript).

A conversation created with initial items records them as its session's first turn, a completed *seed*
turn whose transcript items are those messages: the workers load a turn's history from the transcript
items of the session's completed turns (``TurnRepository.conversation``), so the seed reaches the model
on the conversation's first turn without any change below the gateway, nor any read on a turn's path.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Literal

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db import turn_sql as sql
from shared.db.records import NewTurn
from shared.db.sessions import SessionRecord
from shared.db.tables import SessionRow, TranscriptItemRow, TurnRow
from shared.models.turn import TurnStatus

__all__ = ["ConversationRepository", "SeedTurn", "TranscriptEntry", "UnknownItem"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedTurn:
    """A conversation's initial items, recorded as its session's first turn (completed when recorded)."""

    turn: NewTurn
    """The turn as recorded (its request carries the items as given)."""
    transcript: list[tuple[str, str]]
    """(role, text) of each message, in order: what the next turns' history holds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptEntry:
    """One transcript item of a session: a message of one of its completed turns."""

    turn_id: str
    seq: int
    """Its position within its turn's transcript."""
    role: str
    content: str


class UnknownItem(LookupError):
    """The item a page starts after is not one of the session's transcript items."""


class ConversationRepository:
    """Writes and reads of a session that only its conversation view makes."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def create(
        self,
        *,
        session_id: str,
        org_id: str,
        user_id: str,
        mode: str,
        metadata: dict[str, str] | None,
        seed: SeedTurn | None,
        now: datetime,
    ) -> SessionRecord:
        """Record a new session and, when given, its seed turn with its transcript items, in one transaction.

        Args:
            session_id: the new session's id.
            org_id: its organisation.
            user_id: the user who created it.
            mode: its mode.
            metadata: the client's metadata, or None.
            seed: the seed turn, or None for a conversation without initial items.
            now: the conversation's creation: the session's and the seed turn's time.

        Returns:
            The session as recorded.
        """
        session = SessionRow(
            session_id=session_id, org_id=org_id, user_id=user_id, mode=mode, version=1, created_at=now,
            updated_at=now, client_metadata=metadata,
        )  # fmt: skip
        with self._db.begin() as orm:
            orm.add(session)
            if seed is not None:
                values = sql.new_turn_values(seed.turn, now=now, deadline_at=now)
                values.update(status=TurnStatus.COMPLETED.value, mode=mode, deadline_at=None, completed_at=now)
                orm.add(TurnRow(**values))
                orm.add_all(
                    TranscriptItemRow(session_id=session_id, turn_id=seed.turn.turn_id, seq=seq, role=role,
                                      content=content, created_at=now)
                    for seq, (role, content) in enumerate(seed.transcript)
                )  # fmt: skip
        return _session_record(session)

    def set_metadata(self, session_id: str, *, org_id: str, metadata: dict[str, str] | None) -> SessionRecord | None:
        """Replace the session's client metadata.

        Returns:
            The session as it now stands, or None when ``org_id`` has no session ``session_id``.
        """
        with self._db.begin() as orm:
            row = orm.get(SessionRow, session_id, with_for_update=True)
            if row is None or row.org_id != org_id:
                return None
            row.client_metadata = metadata
            orm.flush()
            return _session_record(row)

    def items(
        self,
        session_id: str,
        *,
        limit: int,
        order: Literal["asc", "desc"],
        after: tuple[str, int] | None = None,
    ) -> list[TranscriptEntry]:
        """A page of the session's transcript items, in the order of its turns (then of each turn's items).

        Args:
            session_id: the session.
            limit: at most this many items.
            order: ``asc`` (oldest first) or ``desc`` (newest first).
            after: the (turn id, seq) of the item the page starts after, in that order.

        Returns:
            The items.

        Raises:
            UnknownItem: ``after`` is not an item of the session.
        """
        ascending = order == "asc"
        query = (
            select(TranscriptItemRow.turn_id, TranscriptItemRow.seq, TranscriptItemRow.role, TranscriptItemRow.content)
            .join(TurnRow, TurnRow.turn_id == TranscriptItemRow.turn_id)
            .where(TranscriptItemRow.session_id == session_id)
            .order_by(*(column.asc() if ascending else column.desc() for column in _ORDER))
            .limit(limit)
        )
        with self._db() as orm:
            if after is not None:
                turn_id, seq = after
                created_at = orm.scalar(
                    select(TurnRow.created_at)
                    .join(TranscriptItemRow, TranscriptItemRow.turn_id == TurnRow.turn_id)
                    .where(TranscriptItemRow.session_id == session_id)
                    .where(TranscriptItemRow.turn_id == turn_id, TranscriptItemRow.seq == seq)
                )
                if created_at is None:
                    raise UnknownItem(f"item {seq} of turn {turn_id!r} is not in session {session_id!r}")
                query = query.where(_beyond((created_at, turn_id, seq), ascending=ascending))
            return [
                TranscriptEntry(turn_id=row.turn_id, seq=row.seq, role=row.role, content=row.content)
                for row in orm.execute(query).all()
            ]


_ORDER = (TurnRow.created_at, TurnRow.turn_id, TranscriptItemRow.seq)
"""A session's transcript items in order: by turn (its acceptance, then its id), then within the turn."""


def _beyond(cursor: tuple[datetime, str, int], *, ascending: bool) -> ColumnElement[bool]:
    """Items after ``cursor`` in ``_ORDER`` (or before it, descending), spelled without row values."""
    condition: ColumnElement[bool] | None = None
    for column, value in reversed(list(zip(_ORDER, cursor, strict=True))):
        past = column > value if ascending else column < value
        condition = past if condition is None else or_(past, and_(column == value, condition))
    assert condition is not None
    return condition


def _session_record(row: SessionRow) -> SessionRecord:
    """The record of a session row (the record's fields are the row's columns)."""
    return SessionRecord(**{field.name: getattr(row, field.name) for field in fields(SessionRecord)})
