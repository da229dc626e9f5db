"""OpenAIBatchRepository: the batches of the OpenAI face (``/openai/v1/batches``).

A batch's row is written first (``validating``), before its input file is read. A valid file then
becomes the Aptix batch of the same id (``shared.db.batches``), whose turns carry its progress; an
invalid one makes the row ``failed`` with the bad lines, with its ``batch.failed`` event (the webhook
outbox) in the same transaction. The row also keeps what the turns cannot say: when the window ran
out (``expired_at``), when its last request ended (``ended_at``) and, once its output and error files
were written, when (``finished_at``) and which.

Two pieces of work on a batch take long: validating its input file, and writing its files once it
ended. Each is a job any gateway may run, held by a lease on the row (``job_token``,
``job_lease_until``): :meth:`OpenAIBatchRepository.due` lists the batches whose job nobody holds,
:meth:`claim` takes one, :meth:`renew` keeps it; a holder that stops leaves it to be claimed again
once its lease ran out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, tuple_, type_coerce, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.openai_files import FileRecord, write_file
from shared.db.tables import BatchRow, OpenAIBatchRow, TurnRow, UTCDateTime
from shared.db.turn_sql import IN_FLIGHT
from shared.db.webhook_outbox import WebhookOutbox

__all__ = [
    "BatchTotals",
    "FinishedFile",
    "OpenAIBatchKeyTaken",
    "OpenAIBatchRecord",
    "OpenAIBatchRepository",
    "UnknownBatchCursor",
]


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
    ended_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    job_attempts: int = 0
    completed_count: int = 0
    failed_count: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTotals:
    """What the turns of an Aptix batch add up to."""

    input_tokens: int
    output_tokens: int
    last_end: datetime | None
    """When the last of them ended (its ``completed_at``, else its last update), None without turns."""
    cancel_requested_at: datetime | None
    """When the Aptix batch was asked to cancel, else None."""


@dataclass(frozen=True, slots=True)
class FinishedFile:
    """One of a batch's files to write: its record and its bytes (chunks of at most a mebibyte)."""

    record: FileRecord
    chunks: Iterable[bytes]


_FIELDS = tuple(field.name for field in fields(OpenAIBatchRecord))
_UNSETTLED = (OpenAIBatchRow.finished_at.is_(None), OpenAIBatchRow.failed_at.is_(None))
"""A batch with work left: neither its files written nor failed."""
_JOB_DUE = (
    *_UNSETTLED,
    or_(OpenAIBatchRow.in_progress_at.is_(None), OpenAIBatchRow.ended_at.is_not(None)),
)
"""A batch with a job to run: it is validating, or it ended and its files are not written."""


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

    def get_any(self, batch_id: str) -> OpenAIBatchRecord:
        """The batch, whoever's it is (for the sweep; it exists)."""
        with self._db() as orm:
            row = orm.get(OpenAIBatchRow, batch_id)
        assert row is not None
        return _record(row)

    def by_idempotency_key(self, org_id: str, key: str) -> OpenAIBatchRecord | None:
        """The organisation's batch created with ``key``."""
        with self._db() as orm:
            row = orm.scalar(
                select(OpenAIBatchRow).where(OpenAIBatchRow.org_id == org_id, OpenAIBatchRow.idempotency_key == key)
            )
        return None if row is None else _record(row)

    def start(self, batch_id: str, *, total: int, at: datetime) -> datetime | None:
        """Note that the batch's Aptix batch (``total`` requests) was recorded at ``at``: it is in progress.

        Returns:
            When it was cancelled while validating, if it was (its Aptix batch is to be cancelled now).
        """
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id, with_for_update=True)
            if row is None:
                return None
            if row.in_progress_at is None:
                row.in_progress_at, row.total = at, total
            return row.cancel_requested_at

    def request_cancel(self, batch_id: str, *, at: datetime) -> bool:
        """Note a cancel of a batch still validating (its validation then records nothing).

        Returns:
            Whether the batch was validating (False: it is in progress, or failed, or ended).
        """
        with self._db.begin() as orm:
            done = orm.execute(
                update(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.batch_id == batch_id,
                    OpenAIBatchRow.in_progress_at.is_(None),
                    *_UNSETTLED,
                )
                .values(cancel_requested_at=func.coalesce(OpenAIBatchRow.cancel_requested_at, at))
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def due(self, *, now: datetime, limit: int = 100) -> list[str]:
        """Batches whose job (validation, or writing the files of one that ended) nobody holds, oldest first."""
        with self._db() as orm:
            return list(
                orm.scalars(
                    select(OpenAIBatchRow.batch_id)
                    .where(
                        *_JOB_DUE,
                        or_(OpenAIBatchRow.job_lease_until.is_(None), OpenAIBatchRow.job_lease_until <= now),
                    )
                    .order_by(OpenAIBatchRow.created_at)
                    .limit(limit)
                )
            )

    def claim(self, batch_id: str, *, token: str, now: datetime, until: datetime) -> OpenAIBatchRecord | None:
        """Take the batch's job until ``until`` if it is due and nobody holds it (counting the attempt).

        Returns:
            The batch as it stands, or None: no job, or held by another.
        """
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id, with_for_update=True)
            if row is None or row.finished_at is not None or row.failed_at is not None:
                return None
            if row.in_progress_at is not None and row.ended_at is None:
                return None
            if row.job_lease_until is not None and row.job_lease_until > now:
                return None
            row.job_token, row.job_lease_until = token, until
            row.job_attempts = (row.job_attempts or 0) + 1
            orm.flush()
            return _record(row)

    def renew(self, batch_id: str, *, token: str, until: datetime) -> bool:
        """Extend the lease of the job ``token`` holds; False: it lost it (another took the job up) or it is done."""
        with self._db.begin() as orm:
            done = orm.execute(
                update(OpenAIBatchRow)
                .where(OpenAIBatchRow.batch_id == batch_id, OpenAIBatchRow.job_token == token, *_UNSETTLED)
                .values(job_lease_until=until)
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def release(self, batch_id: str, *, token: str, retry_at: datetime, counted: bool) -> None:
        """Give the job ``token`` holds back, to be claimed again from ``retry_at``.

        Args:
            batch_id: the batch.
            token: its holder.
            retry_at: when it is due again.
            counted: whether the attempt counts (False: its gateway stopped in good order).
        """
        values: dict[str, Any] = {"job_token": None, "job_lease_until": retry_at}
        if not counted:
            values["job_attempts"] = OpenAIBatchRow.job_attempts - 1
        with self._db.begin() as orm:
            orm.execute(
                update(OpenAIBatchRow)
                .where(OpenAIBatchRow.batch_id == batch_id, OpenAIBatchRow.job_token == token)
                .values(**values)
            )

    def note_ended(self, batch_id: str, *, at: datetime) -> bool:
        """Note that the last request of the batch ended at ``at``: its files are to be written (``finalizing``).

        Returns:
            Whether this call noted it.
        """
        with self._db.begin() as orm:
            done = orm.execute(
                update(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.batch_id == batch_id,
                    OpenAIBatchRow.ended_at.is_(None),
                    OpenAIBatchRow.in_progress_at.is_not(None),
                    *_UNSETTLED,
                )
                .values(ended_at=at, job_token=None, job_lease_until=None)
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def ended_unnoted(self, *, limit: int = 100) -> list[str]:
        """Batches in progress none of whose turns is queued or running any more, their end not noted yet."""
        moving = select(TurnRow.turn_id).where(
            TurnRow.batch_id == OpenAIBatchRow.batch_id, TurnRow.status.in_(IN_FLIGHT)
        )
        with self._db() as orm:
            return list(
                orm.scalars(
                    select(OpenAIBatchRow.batch_id)
                    .where(
                        OpenAIBatchRow.in_progress_at.is_not(None),
                        OpenAIBatchRow.ended_at.is_(None),
                        *_UNSETTLED,
                        ~moving.exists(),
                    )
                    .order_by(OpenAIBatchRow.created_at)
                    .limit(limit)
                )
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
            row.job_token = row.job_lease_until = None
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

    def finish(
        self, batch_id: str, *, at: datetime, files: Iterable[FinishedFile], event: str | None
    ) -> list[str] | None:
        """Write the batch's output and error files and note it finished at ``at``, with its event, in one
        transaction, unless another holder did first.

        Args:
            batch_id: the batch.
            at: when its files were written (``finished_at``).
            files: its files (each with at least a line).
            event: its webhook event (``batch.completed``, ``cancelled``, ``expired``), None for none.

        Returns:
            The ids of the webhook deliveries recorded (to send once this committed); None: another did it.
        """
        if self._outbox is not None:
            self._outbox.prepare()
        with self._db.begin() as orm:
            row = orm.get(OpenAIBatchRow, batch_id, with_for_update=True)
            if row is None or row.finished_at is not None or row.failed_at is not None:
                return None
            row.finished_at = at
            row.ended_at = row.ended_at or at
            row.job_token = row.job_lease_until = None
            for file in files:
                written = write_file(orm, file.record, file.chunks)
                if file.record.batch_part == "output":
                    row.output_file_id, row.completed_count = written.file_id, written.lines
                else:
                    row.error_file_id, row.failed_count = written.file_id, written.lines
            orm.flush()
            if event is None or self._outbox is None:
                return []
            return self._outbox.record_openai_batch(
                orm, batch_id, event=event, org_id=row.org_id, webhook_url=row.webhook_url, now=at
            )

    def overdue(self, *, now: datetime, limit: int = 100) -> list[OpenAIBatchRecord]:
        """Batches in progress past their ``expires_at`` whose expiry was not noted yet."""
        with self._db() as orm:
            rows = orm.scalars(
                select(OpenAIBatchRow)
                .where(
                    OpenAIBatchRow.expires_at <= now,
                    OpenAIBatchRow.in_progress_at.is_not(None),
                    OpenAIBatchRow.expired_at.is_(None),
                    OpenAIBatchRow.ended_at.is_(None),
                    OpenAIBatchRow.finished_at.is_(None),
                )
                .limit(limit)
            )
            return [_record(row) for row in rows]

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


def _record(row: OpenAIBatchRow) -> OpenAIBatchRecord:
    return OpenAIBatchRecord(**{name: getattr(row, name) for name in _FIELDS})
