"""BatchRepository: a batch and its turns, recorded together in one transaction; its cancel and its listing.

A batch's turns are the turns it created (``turns.batch_id``) and the earlier turns its requests named
by idempotency key (``batch_reused_turns``); counts and results take both, in request order.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from operator import itemgetter

from sqlalchemy import Select, Table, func, insert, select, tuple_, union_all
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.records import NewTurn, TurnRecord
from shared.db.tables import BatchReusedTurnRow, BatchRow, TurnRow
from shared.db.turn_sql import new_turn_values, to_record
from shared.db.turns import SessionBusy
from shared.models.turn import TurnStatus

__all__ = [
    "INSERT_CHUNK",
    "BatchKeyTaken",
    "BatchRecord",
    "BatchRepository",
    "ReusedTurn",
    "TurnKeyTaken",
    "UnknownCursor",
]

INSERT_CHUNK = 500
"""Turn rows per ``INSERT`` statement of a batch (all of them in one transaction)."""

_TURNS: Table = TurnRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table


class BatchKeyTaken(Exception):
    """Another batch of the organisation has this idempotency key (a concurrent POST won)."""


class TurnKeyTaken(Exception):
    """A turn of the organisation took one of the batch's per-request idempotency keys meanwhile."""


class UnknownCursor(Exception):
    """The ``after`` cursor names no batch of the organisation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """A batch of turns submitted together, as recorded."""

    batch_id: str
    org_id: str
    user_id: str
    total: int
    """How many turns the batch holds (reused ones included)."""
    created_at: datetime
    webhook_url: str | None = None
    """Where its ``batch.completed`` event goes (else the organisation's default)."""
    idempotency_key: str | None = None
    request_hash: str | None = None
    """The hash of the body the batch was created with (its idempotency key aside)."""
    reused: int = 0
    """How many requests an earlier turn stands for (``ReusedTurn``)."""
    cancel_requested_at: datetime | None = None
    cancel_mode: str | None = None
    """``finish`` or ``cancel``: what the cancel does to running turns."""


@dataclass(frozen=True, slots=True)
class ReusedTurn:
    """A request of the batch (``batch_index``) that an earlier turn (``turn_id``) stands for."""

    batch_index: int
    turn_id: str


class BatchRepository:
    """Reads and writes of batches."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    @contextmanager
    def creating(
        self,
        batch: BatchRecord,
        turns: Iterable[NewTurn],
        *,
        now: datetime,
        deadline_at: datetime,
        reused: Sequence[ReusedTurn] = (),
    ) -> Iterator[list[str]]:
        """Record the batch, its reused turns and all its new queued turns, or nothing, in a transaction
        that stays open for the caller's block.

        The rows are written when the block starts, :data:`INSERT_CHUNK` turns per statement; ``turns``
        may be a generator (a spooled upload), read once. They are committed when the block ends; if
        the block raises, nothing is recorded (the gateway sends or holds the turns in the block, as
        ``TurnRepository.creating`` does for one turn).

        Yields:
            The new turns' ids, in request order.

        Raises:
            BatchKeyTaken: the batch's idempotency key was taken meanwhile (the batch row goes first, so
                nothing else was written).
            TurnKeyTaken: a per-request idempotency key was taken meanwhile.
            SessionBusy: one of the turns' sessions has an unfinished turn.
            All three when the rows are written or at the commit alike.
        """
        turn_ids: list[str] = []
        phase = "write"
        try:
            with self._db.begin() as orm:
                orm.add(_batch_row(batch))
                orm.flush()
                if reused:
                    rows = [
                        {"batch_id": batch.batch_id, "batch_index": r.batch_index, "turn_id": r.turn_id} for r in reused
                    ]
                    orm.execute(insert(BatchReusedTurnRow), rows)
                iterator = iter(turns)
                while chunk := list(islice(iterator, INSERT_CHUNK)):
                    orm.execute(insert(_TURNS), [new_turn_values(t, now=now, deadline_at=deadline_at) for t in chunk])
                    turn_ids.extend(turn.turn_id for turn in chunk)
                phase = "block"
                yield turn_ids
                phase = "commit"
        except IntegrityError as exc:
            if phase == "block":
                raise  # the block's own, not this write's
            raise _taken(batch, exc) from exc

    def get(self, batch_id: str, *, org_id: str) -> BatchRecord | None:
        """The batch, if it belongs to ``org_id``."""
        with self._db() as orm:
            row = orm.get(BatchRow, batch_id)
        return None if row is None or row.org_id != org_id else _record(row)

    def by_idempotency_key(self, org_id: str, key: str) -> BatchRecord | None:
        """The organisation's batch created with idempotency key ``key``, if any."""
        with self._db() as orm:
            row = orm.scalar(select(BatchRow).where(BatchRow.org_id == org_id, BatchRow.idempotency_key == key))
        return None if row is None else _record(row)

    def request_cancel(self, batch_id: str, *, mode: str, now: datetime) -> BatchRecord | None:
        """Note that the batch is to be cancelled (the first request's time stays; ``cancel`` overrides ``finish``).

        Returns:
            The batch as it now stands, or None when it does not exist.
        """
        with self._db.begin() as orm:
            row = orm.get(BatchRow, batch_id, with_for_update=True)
            if row is None:
                return None
            if row.cancel_requested_at is None:
                row.cancel_requested_at = now
            if row.cancel_mode != "cancel":
                row.cancel_mode = mode
            orm.flush()
            return _record(row)

    def turn_ids(self, batch_id: str, *, statuses: Iterable[TurnStatus]) -> list[str]:
        """Ids of the turns the batch created (not those it reuses) that stand in one of ``statuses``."""
        values = sorted(status.value for status in statuses)
        with self._db() as orm:
            return list(
                orm.scalars(select(TurnRow.turn_id).where(TurnRow.batch_id == batch_id, TurnRow.status.in_(values)))
            )

    def counts(self, batch_id: str) -> dict[TurnStatus, int]:
        """How many of the batch's turns (reused ones included) are in each status (every status present)."""
        return self.counts_of([batch_id])[batch_id]

    def counts_of(self, batch_ids: Sequence[str]) -> dict[str, dict[TurnStatus, int]]:
        """:meth:`counts` of several batches, in one query."""
        result = {batch_id: dict.fromkeys(TurnStatus, 0) for batch_id in batch_ids}
        if not batch_ids:
            return result
        own = select(TurnRow.batch_id.label("batch_id"), TurnRow.status.label("status")).where(
            TurnRow.batch_id.in_(batch_ids)
        )
        reused = (
            select(BatchReusedTurnRow.batch_id.label("batch_id"), TurnRow.status.label("status"))
            .join(TurnRow, TurnRow.turn_id == BatchReusedTurnRow.turn_id)
            .where(BatchReusedTurnRow.batch_id.in_(batch_ids))
        )
        both = union_all(own, reused).subquery()
        query = select(both.c.batch_id, both.c.status, func.count()).group_by(both.c.batch_id, both.c.status)
        with self._db() as orm:
            for batch_id, status, count in orm.execute(query).all():
                result[batch_id][TurnStatus(status)] = int(count)
        return result

    def turns(self, batch_id: str, *, chunk: int = 500) -> Iterator[TurnRecord]:
        """The batch's turns (reused ones included) in request order, read ``chunk`` at a time.

        Two keyset-paged reads merged by ``batch_index``: the turns the batch created (each page a range
        of ``ix_turns_batch_order``: ``batch_index`` past the last one read, in order, ``LIMIT chunk``) and
        its reused turns (a range of ``batch_reused_turns``' primary key). A page costs the same wherever it
        is in the batch, so reading a batch is linear in its size. Each page is its own short query: no
        transaction stays open between them.
        """
        own = self._pages(batch_id, _own_page, chunk=chunk)
        reused = self._pages(batch_id, _reused_page, chunk=chunk)
        for _index, record in heapq.merge(own, reused, key=itemgetter(0)):
            yield record

    def _pages(self, batch_id: str, page: _Page, *, chunk: int) -> Iterator[tuple[int, TurnRecord]]:
        """``(batch_index, turn)`` of one of :meth:`turns`' two reads, a page of ``chunk`` at a time."""
        last = -1
        while True:
            with self._db() as orm:
                found = orm.execute(page(batch_id, last, chunk)).all()
                # (batch_index > last is never true of a NULL: every index read is an int)
                rows = [(index, to_record(row)) for row, index in found if index is not None]
            yield from rows
            if len(found) < chunk:
                return
            last = rows[-1][0]

    def page(self, org_id: str, *, limit: int, after: str | None = None) -> tuple[list[BatchRecord], bool]:
        """A page of the organisation's batches, newest first, and whether older ones follow.

        Args:
            org_id: the organisation.
            limit: at most this many.
            after: the id of the last batch of the previous page.

        Raises:
            UnknownCursor: ``after`` names no batch of ``org_id``.
        """
        query = select(BatchRow).where(BatchRow.org_id == org_id)
        with self._db() as orm:
            if after is not None:
                cursor = orm.get(BatchRow, after)
                if cursor is None or cursor.org_id != org_id:
                    raise UnknownCursor(after)
                query = query.where(
                    tuple_(BatchRow.created_at, BatchRow.batch_id) < (cursor.created_at, cursor.batch_id)
                )
            rows = list(
                orm.scalars(query.order_by(BatchRow.created_at.desc(), BatchRow.batch_id.desc()).limit(limit + 1))
            )
        return [_record(row) for row in rows[:limit]], len(rows) > limit


def _taken(batch: BatchRecord, exc: IntegrityError) -> Exception:
    """What a unique index refusing the batch's rows means, by the index the database names."""
    text = str(exc.orig)
    if "uq_batches_org_idempotency_key" in text or "batches.idempotency_key" in text:
        return BatchKeyTaken(batch.idempotency_key)
    if "uq_turns_org_idempotency_key" in text or "turns.idempotency_key" in text:
        return TurnKeyTaken(batch.batch_id)
    return SessionBusy("a session of this batch has a turn that is not finished")


_Page = Callable[[str, int, int], Select[TurnRow, int | None]]
"""A page query of :meth:`BatchRepository.turns`: (batch id, last ``batch_index`` read, page size)."""


def _own_page(batch_id: str, last: int, chunk: int) -> Select[TurnRow, int | None]:
    """The next ``chunk`` turns the batch created after request ``last`` (a range of ``ix_turns_batch_order``)."""
    return (
        select(TurnRow, TurnRow.batch_index)
        .where(TurnRow.batch_id == batch_id, TurnRow.batch_index > last)
        .order_by(TurnRow.batch_index)
        .limit(chunk)
    )


def _reused_page(batch_id: str, last: int, chunk: int) -> Select[TurnRow, int | None]:
    """The next ``chunk`` earlier turns the batch reuses after request ``last`` (a range of their primary key)."""
    return (
        select(TurnRow, BatchReusedTurnRow.batch_index)
        .join(TurnRow, TurnRow.turn_id == BatchReusedTurnRow.turn_id)
        .where(BatchReusedTurnRow.batch_id == batch_id, BatchReusedTurnRow.batch_index > last)
        .order_by(BatchReusedTurnRow.batch_index)
        .limit(chunk)
    )


def _record(row: BatchRow) -> BatchRecord:
    return BatchRecord(
        batch_id=row.batch_id, org_id=row.org_id, user_id=row.user_id, total=row.total, created_at=row.created_at,
        webhook_url=row.webhook_url, idempotency_key=row.idempotency_key, request_hash=row.request_hash,
        reused=row.reused, cancel_requested_at=row.cancel_requested_at, cancel_mode=row.cancel_mode,
    )  # fmt: skip


def _batch_row(batch: BatchRecord) -> BatchRow:
    return BatchRow(
        batch_id=batch.batch_id, org_id=batch.org_id, user_id=batch.user_id, total=batch.total,
        created_at=batch.created_at, webhook_url=batch.webhook_url, idempotency_key=batch.idempotency_key,
        request_hash=batch.request_hash, reused=batch.reused, cancel_requested_at=None, cancel_mode=None,
    )  # fmt: skip
