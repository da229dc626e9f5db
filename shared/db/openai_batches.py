"""OpenAIBatchRepository: the batches of the OpenAI face (``/openai/v1/batches``).

A batch's row is written first (``validating``), before its input file is read. A valid file then
becomes the Aptix batch of the same id (``shared.db.batches``), whose turns carry its progress; an
invalid one makes the row ``failed`` with the bad lines, with its ``batch.failed`` event (the webhook
outbox) in the same transaction. The row also keeps what the turns cannot say: when the window ran
out (``expired_at``) and, once every request ended, when (``finished_at``) and the output and error files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, tuple_, type_coerce, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.openai_files import FileRecord
from shared.db.tables import BatchRow, OpenAIBatchRow, OpenAIFileRow, TurnRow, UTCDateTime
from shared.db.webhook_outbox import WebhookOutbox

__all__ = ["BatchTotals", "OpenAIBatchKeyTaken", "OpenAIBatchRecord", "OpenAIBatchRepository", "UnknownBatchCursor"]


class OpenAIBatchKeyTaken(Exception):
    """Another batch of the organisation has this ``Idempotency-Key``."""


class UnknownBatchCursor(Exception):
    """The ``after`` cursor names no batch of the organisation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAIBatchRecord:
    """A batch of the OpenAI face as recorded (``OpenAIBatchRow``)."""

    batch_id: str
    org_id: str
    user_id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    client_metadata: dict[str, Any] | None
    output_expires_seconds: int | None
    webhook_url: str | None
    idempotency_key: str | None
    request_hash: str
    created_at: datetime
    expires_at: datetime
    total: int = 0
    errors: list[dict[str, Any]] | None = None
    in_progress_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    finished_at: datetime | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTotals:
    """What the turns of an Aptix batch add up to."""

    input_tokens: int
    output_tokens: int
    last_end: datetime | None
    """When the last of them ended (its ``completed_at``, else its last update), None without turns."""
    cancel_requested_at: datetime | None
    """When the Aptix batch was asked to cancel, else None."""


_FIELDS = tuple(field.name for field in fields(OpenAIBatchRecord))


class OpenAIBatchRepository:
    """Reads and writes of the OpenAI face's batches."""

    def __init__(self, db: sessionmaker[Session], *, outbox: WebhookOutbox | None) -> None:
        self._db = db
        self._outbox = outbox

    def add(self, record: OpenAIBatchRecord) -> None:
        """Record a new batch (``validating``).

        Raises:
            OpenAIBatchKeyTaken: the organisation has a batch with this ``idempotency_key``.
        """
        try:
            with self._db.begin() as orm:
                orm.add(OpenAIBatchRow(**{name: getattr(record, name) for name in _FIELDS}))
        except IntegrityError as exc:
            raise OpenAIBatchKeyTaken(record.idempotency_key) from exc

    def get(self, batch_id: str, *, org_id: str) -> OpenAIBatchRecord | None:
        """The batch, if it belongs to ``org_id``."""
        with self._db() as orm:
            row = orm.get(OpenAIBatchRow, batch_id)
        return None if row is None or row.org_id != org_id else _record(row)

    def by_idempotency_key(self, org_id: str, key: str) -> OpenAIBatchRecord | None:
        """The organisation's batch created with ``key``."""
        with self._db() as orm:
            row = orm.scalar(
                select(OpenAIBatchRow).where(OpenAIBatchRow.org_id == org_id, OpenAIBatchRow.idempotency_key == key)
            )
        return None if row is None else _record(row)

    def remove(self, batch_id: str) -> None:
        """Forget a batch whose Aptix batch could not be recorded (the broker refused): a retry starts afresh."""
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id)
            if row is not None and row.in_progress_at is None and row.failed_at is None:
                orm.delete(row)

    def has_aptix_batch(self, batch_id: str) -> datetime | None:
        """When the Aptix batch of this id was created, if it was."""
        with self._db() as orm:
            return orm.scalar(select(BatchRow.created_at).where(BatchRow.batch_id == batch_id))

    def start(self, batch_id: str, *, total: int, at: datetime) -> None:
        """Note that the batch's Aptix batch (``total`` requests) was recorded at ``at``: it is in progress."""
        with self._db.begin() as orm:
            orm.execute(
                update(OpenAIBatchRow)
                .where(OpenAIBatchRow.batch_id == batch_id, OpenAIBatchRow.in_progress_at.is_(None))
                .values(in_progress_at=at, total=total)
            )

    def fail(self, batch_id: str, *, errors: list[dict[str, Any]], total: int, at: datetime) -> list[str]:
        """Make a validating batch ``failed`` with ``errors``, and record its ``batch.failed`` event.

        Returns:
            The ids of the webhook deliveries recorded (to send once this committed).
        """
        if self._outbox is not None:
            self._outbox.prepare()
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id, with_for_update=True)
            if row is None or row.failed_at is not None or row.in_progress_at is not None:
                return []
            row.failed_at, row.errors, row.total = at, errors, total
            orm.flush()
            if self._outbox is None:
                return []
            return self._outbox.record_openai_batch(
                orm, batch_id, event="batch.failed", org_id=row.org_id, webhook_url=row.webhook_url, now=at
            )

    def note_expired(self, batch_id: str, *, at: datetime) -> bool:
        """Note that the batch's window ran out (before its requests still unfinished are cancelled).

        Returns:
            Whether this call noted it (False: noted before, or the batch is not in progress).
        """
        with self._db.begin() as orm:
            done = orm.execute(
                update(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.batch_id == batch_id,
                    OpenAIBatchRow.expired_at.is_(None),
                    OpenAIBatchRow.finished_at.is_(None),
                    OpenAIBatchRow.in_progress_at.is_not(None),
                )
                .values(expired_at=at)
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def finish(self, batch_id: str, *, at: datetime, files: list[FileRecord]) -> bool:
        """Note the batch's end and its output and error files, unless another reader did first.

        Returns:
            Whether this call wrote them.
        """
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id, with_for_update=True)
            if row is None or row.finished_at is not None:
                return False
            row.finished_at = at
            for file in files:
                orm.add(OpenAIFileRow(**{name: getattr(file, name) for name in _FILE_FIELDS}))
                if file.batch_part == "output":
                    row.output_file_id = file.file_id
                else:
                    row.error_file_id = file.file_id
            return True

    def overdue(self, *, now: datetime, limit: int = 100) -> list[OpenAIBatchRecord]:
        """Batches in progress past their ``expires_at`` whose expiry was not noted yet."""
        with self._db() as orm:
            rows = orm.scalars(
                select(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.expires_at <= now,
                    OpenAIBatchRow.in_progress_at.is_not(None),
                    OpenAIBatchRow.expired_at.is_(None),
                    OpenAIBatchRow.finished_at.is_(None),
                )
                .limit(limit)
            )
            return [_record(row) for row in rows]

    def stale_validating(self, *, older_than: datetime, limit: int = 100) -> Iterator[OpenAIBatchRecord]:
        """Batches still ``validating`` that were created before ``older_than`` (their gateway stopped)."""
        with self._db() as orm:
            rows = orm.scalars(
                select(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.created_at < older_than,
                    OpenAIBatchRow.in_progress_at.is_(None),
                    OpenAIBatchRow.failed_at.is_(None),
                )
                .limit(limit)
            )
            found = [_record(row) for row in rows]
        yield from found

    def totals(self, batch_id: str) -> BatchTotals:
        """The tokens the batch's turns used, when the last of them ended, and its cancel (one query each)."""
        ended = func.coalesce(TurnRow.completed_at, TurnRow.updated_at)
        query = select(
            func.coalesce(func.sum(TurnRow.usage["input_tokens"].as_integer()), 0),
            func.coalesce(func.sum(TurnRow.usage["output_tokens"].as_integer()), 0),
            type_coerce(func.max(ended), UTCDateTime()),
        ).where(TurnRow.batch_id == batch_id)
        with self._db() as orm:
            input_tokens, output_tokens, last_end = orm.execute(query).one()
            cancel = orm.scalar(select(BatchRow.cancel_requested_at).where(BatchRow.batch_id == batch_id))
        return BatchTotals(
            input_tokens=int(input_tokens), output_tokens=int(output_tokens), last_end=last_end,
            cancel_requested_at=cancel,
        )  # fmt: skip

    def page(self, org_id: str, *, limit: int, after: str | None) -> tuple[list[OpenAIBatchRecord], bool]:
        """A page of the organisation's batches, newest first, and whether older ones follow.

        Raises:
            UnknownBatchCursor: ``after`` names no batch of ``org_id``.
        """
        query = select(OpenAIBatchRow).where(OpenAIBatchRow.org_id == org_id)
        with self._db() as orm:
            if after is not None:
                cursor = orm.get(OpenAIBatchRow, after)
                if cursor is None or cursor.org_id != org_id:
                    raise UnknownBatchCursor(after)
                query = query.where(
                    tuple_(OpenAIBatchRow.created_at, OpenAIBatchRow.batch_id) < (cursor.created_at, cursor.batch_id)
                )
            query = query.order_by(OpenAIBatchRow.created_at.desc(), OpenAIBatchRow.batch_id.desc())
            rows = list(orm.scalars(query.limit(limit + 1)))
        return [_record(row) for row in rows[:limit]], len(rows) > limit


_FILE_FIELDS = tuple(field.name for field in fields(FileRecord))


def _record(row: OpenAIBatchRow) -> OpenAIBatchRecord:
    return OpenAIBatchRecord(**{name: getattr(row, name) for name in _FIELDS})
