"""BatchRepository: a batch and its turns, recorded together in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.records import NewTurn, TurnRecord
from shared.db.tables import BatchRow, TurnRow
from shared.db.turn_sql import new_turn_row, to_record
from shared.db.turns import SessionBusy
from shared.models.turn import TurnStatus

__all__ = ["BatchRecord", "BatchRepository"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """A batch of turns submitted together, as recorded."""

    batch_id: str
    org_id: str
    user_id: str
    total: int
    """How many turns the batch holds."""
    created_at: datetime
    webhook_url: str | None = None
    """Where its ``batch.completed`` event goes (else the organisation's default)."""


class BatchRepository:
    """Reads and writes of batches."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def create(
        self,
        batch: BatchRecord,
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
            with self._db.begin() as orm:
                orm.add(_batch_row(batch))
                orm.flush()
                orm.add_all([new_turn_row(turn, now=now, deadline_at=deadline_at) for turn in turns])
                orm.flush()
                if before_commit is not None:
                    before_commit()
        except IntegrityError as exc:
            raise SessionBusy("a session of this batch has a turn that is not finished") from exc

    def get(self, batch_id: str, *, org_id: str) -> BatchRecord | None:
        """The batch, if it belongs to ``org_id``."""
        with self._db() as orm:
            row = orm.get(BatchRow, batch_id)
        if row is None or row.org_id != org_id:
            return None
        return BatchRecord(
            batch_id=row.batch_id, org_id=row.org_id, user_id=row.user_id, total=row.total, created_at=row.created_at,
            webhook_url=row.webhook_url,
        )  # fmt: skip

    def counts(self, batch_id: str) -> dict[TurnStatus, int]:
        """How many of the batch's turns are in each status (every status present)."""
        with self._db() as orm:
            rows = orm.execute(
                select(TurnRow.status, func.count()).where(TurnRow.batch_id == batch_id).group_by(TurnRow.status)
            ).all()
        counts = dict.fromkeys(TurnStatus, 0)
        for status, count in rows:
            counts[TurnStatus(status)] = int(count)
        return counts

    def turns(self, batch_id: str, *, chunk: int = 500) -> Iterator[TurnRecord]:
        """The batch's turns in request order, read in chunks."""
        last = -1
        while True:
            with self._db() as orm:
                rows = list(
                    orm.scalars(
                        select(TurnRow)
                        .where(TurnRow.batch_id == batch_id, TurnRow.batch_index > last)
                        .order_by(TurnRow.batch_index)
                        .limit(chunk)
                    )
                )
            yield from (to_record(row) for row in rows)
            if len(rows) < chunk:
                return
            last = rows[-1].batch_index if rows[-1].batch_index is not None else last


def _batch_row(batch: BatchRecord) -> BatchRow:
    return BatchRow(
        batch_id=batch.batch_id, org_id=batch.org_id, user_id=batch.user_id, total=batch.total,
        created_at=batch.created_at, webhook_url=batch.webhook_url,
    )  # fmt: skip
