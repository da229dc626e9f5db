"""OpenAIFileRepository: the files of the OpenAI face, their bytes kept in chunks of at most a mebibyte.

An upload is written as it is read (:meth:`OpenAIFileRepository.create` takes an iterator of chunks and
inserts each as it comes, all in one transaction), and read back the same way (:meth:`chunks`, one
short query per chunk): no file is ever whole in a process's memory. A batch's output and error files
are written the same way (:func:`write_file`), in the transaction that notes the batch finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import datetime

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import OpenAIFileChunkRow, OpenAIFileRow

__all__ = ["FileRecord", "OpenAIFileRepository", "UnknownFileCursor", "write_file"]


class UnknownFileCursor(Exception):
    """The ``after`` cursor names no file of the organisation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FileRecord:
    """A file as recorded."""

    file_id: str
    org_id: str
    purpose: str
    filename: str
    bytes: int
    lines: int
    created_at: datetime
    expires_at: datetime | None
    batch_id: str | None = None
    """The batch whose output or error file this is (written when the batch ended), else None (an upload)."""
    batch_part: str | None = None
    """``output`` or ``error`` for a batch's file."""


_FIELDS = tuple(field.name for field in fields(FileRecord))


class OpenAIFileRepository:
    """Reads and writes of the OpenAI face's files."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def create(self, record: FileRecord, chunks: Iterable[bytes], *, check: Callable[[int, int], None]) -> FileRecord:
        """Record an upload: its row and each chunk as it comes, in one transaction (nothing if ``check`` raises).

        Args:
            record: the file (its ``bytes`` and ``lines`` are what ``check`` last saw, written at the end).
            chunks: the file's bytes in order, each at most what one row should hold.
            check: called after each chunk with the bytes and the non-blank lines so far; raises to refuse
                the file (the transaction rolls back).

        Returns:
            The record as written (with its size and lines).
        """
        with self._db.begin() as orm:
            return write_file(orm, record, chunks, check=check)

    def get(self, file_id: str, *, org_id: str, now: datetime) -> FileRecord | None:
        """The file, if it belongs to ``org_id`` and has not expired."""
        with self._db() as orm:
            row = orm.get(OpenAIFileRow, file_id)
        if row is None or row.org_id != org_id or (row.expires_at is not None and row.expires_at <= now):
            return None
        return _record(row)

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The file's bytes, a chunk per query (check the caller with :meth:`get` first)."""
        seq = 0
        while True:
            with self._db() as orm:
                data = orm.scalar(
                    select(OpenAIFileChunkRow.data).where(
                        OpenAIFileChunkRow.file_id == file_id, OpenAIFileChunkRow.seq == seq
                    )
                )
            if data is None:
                return
            yield bytes(data)
            seq += 1

    def lines(self, file_id: str) -> Iterator[bytes]:
        """The file's lines (each with its line break, if any), read chunk by chunk."""
        pending = b""
        for chunk in self.chunks(file_id):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if pending:
            yield pending

    def delete(self, file_id: str) -> bool:
        """Delete the file and its chunks; whether there was one."""
        with self._db.begin() as orm:
            orm.execute(delete(OpenAIFileChunkRow).where(OpenAIFileChunkRow.file_id == file_id))
            result = orm.execute(delete(OpenAIFileRow).where(OpenAIFileRow.file_id == file_id))
            return bool(result.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def delete_expired(self, *, now: datetime, limit: int = 100) -> int:
        """Delete up to ``limit`` files past their ``expires_at``; how many went."""
        with self._db() as orm:
            expired = list(
                orm.scalars(select(OpenAIFileRow.file_id).where(OpenAIFileRow.expires_at <= now).limit(limit))
            )
        return sum(self.delete(file_id) for file_id in expired)

    def page(
        self, org_id: str, *, now: datetime, limit: int, after: str | None, ascending: bool, purpose: str | None
    ) -> tuple[list[FileRecord], bool]:
        """A page of the organisation's unexpired files in creation order, and whether more follow.

        Raises:
            UnknownFileCursor: ``after`` names no file of ``org_id``.
        """
        query = select(OpenAIFileRow).where(
            OpenAIFileRow.org_id == org_id,
            (OpenAIFileRow.expires_at.is_(None)) | (OpenAIFileRow.expires_at > now),
        )
        if purpose is not None:
            query = query.where(OpenAIFileRow.purpose == purpose)
        key = tuple_(OpenAIFileRow.created_at, OpenAIFileRow.file_id)
        with self._db() as orm:
            if after is not None:
                cursor = orm.get(OpenAIFileRow, after)
                if cursor is None or cursor.org_id != org_id:
                    raise UnknownFileCursor(after)
                mark = (cursor.created_at, cursor.file_id)
                query = query.where(key > mark if ascending else key < mark)
            if ascending:
                query = query.order_by(OpenAIFileRow.created_at, OpenAIFileRow.file_id)
            else:
                query = query.order_by(OpenAIFileRow.created_at.desc(), OpenAIFileRow.file_id.desc())
            rows = list(orm.scalars(query.limit(limit + 1)))
        return [_record(row) for row in rows[:limit]], len(rows) > limit


def write_file(
    orm: Session, record: FileRecord, chunks: Iterable[bytes], *, check: Callable[[int, int], None] | None = None
) -> FileRecord:
    """Write a file's row and each of its chunks as it comes, in the caller's transaction.

    Args:
        orm: the open transaction.
        record: the file (its ``bytes`` and ``lines`` are counted here).
        chunks: the file's bytes in order, each at most what one row should hold.
        check: called after each chunk with the bytes and the non-blank lines so far; raises to refuse
            the file (the caller's transaction then rolls back).

    Returns:
        The record as written (with its size and lines).
    """
    size = lines = 0
    open_line = False
    orm.add(OpenAIFileRow(**{**_values(record), "bytes": 0, "lines": 0}))
    orm.flush()
    for seq, chunk in enumerate(chunks):
        size += len(chunk)
        counted, open_line = _count_lines(chunk, open_line=open_line)
        lines += counted
        if check is not None:
            check(size, lines)
        orm.add(OpenAIFileChunkRow(file_id=record.file_id, seq=seq, data=chunk))
        orm.flush()
    if open_line:
        lines += 1
        if check is not None:
            check(size, lines)
    row = orm.get(OpenAIFileRow, record.file_id)
    assert row is not None
    row.bytes, row.lines = size, lines
    return _record(row)


def _count_lines(chunk: bytes, *, open_line: bool) -> tuple[int, bool]:
    """The non-blank lines ``chunk`` ends, and whether the line it leaves open has anything but blanks yet.

    Args:
        chunk: the next bytes of the file.
        open_line: whether the line the previous chunk left open had anything but blanks.
    """
    *complete, rest = chunk.split(b"\n")
    ended = 0
    for part in complete:
        if open_line or part.strip():
            ended += 1
        open_line = False
    return ended, open_line or bool(rest.strip())


def _values(record: FileRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in _FIELDS}


def _record(row: OpenAIFileRow) -> FileRecord:
    return FileRecord(**{name: getattr(row, name) for name in _FIELDS})
