"""BatchRepository: a batch and its turns, recorded together in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import BatchRow, TurnRow
from shared.db.turns import NewTurn, SessionBusy, new_turn_row
from shared.models.turn import TurnStatus

__all__ = ["BatchRepository"]


class BatchRepository:
    """Reads and writes of batches."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def create(
        self,
        batch: BatchRow,
        turns: list[NewTurn],
        *,
        now: datetime,
        deadline_at: datetime,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """Record the batch and all its queued turns, or nothing.

        ``before_commit`` runs with every row written but not committed (see TurnRepository.create).

        Raises:
            SessionBusy: one of the turns' sessions has an unfinished turn.
        """
        try:
            with self._sessions.begin() as db:
                db.add(batch)
                db.flush()
                db.add_all([new_turn_row(turn, now=now, deadline_at=deadline_at) for turn in turns])
                db.flush()
                if before_commit is not None:
                    before_commit()
        except IntegrityError as exc:
            raise SessionBusy("a session of this batch has a turn that is not finished") from exc

    def get(self, batch_id: str, *, org_id: str) -> BatchRow | None:
        """The batch, if it belongs to ``org_id``."""
        with self._sessions() as db:
            row = db.get(BatchRow, batch_id)
        return row if row is not None and row.org_id == org_id else None

    def counts(self, batch_id: str) -> dict[TurnStatus, int]:
        """How many of the batch's turns are in each status (every status present)."""
        with self._sessions() as db:
            rows = db.execute(
                select(TurnRow.status, func.count()).where(TurnRow.batch_id == batch_id).group_by(TurnRow.status)
            ).all()
        counts = {status: 0 for status in TurnStatus}
        for status, count in rows:
            counts[TurnStatus(status)] = int(count)
        return counts

    def turns(self, batch_id: str, *, chunk: int = 500) -> Iterator[TurnRow]:
        """The batch's turns in request order, read in chunks."""
        last = -1
        while True:
            with self._sessions() as db:
                rows = list(
                    db.scalars(
                        select(TurnRow)
                        .where(TurnRow.batch_id == batch_id, TurnRow.batch_index > last)
                        .order_by(TurnRow.batch_index)
                        .limit(chunk)
                    )
                )
            yield from rows
            if len(rows) < chunk:
                return
            last = rows[-1].batch_index if rows[-1].batch_index is not None else last
