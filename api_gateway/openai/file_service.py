"""FileService: OpenAI's Files API for batch input files, kept in PostgreSQL (or SQLite) in chunks.

An upload is read from the multipart part (which Starlette spools to disk past a mebibyte) a chunk at
a time and each chunk written as it is read (``OpenAIFileRepository.create``), with the size and line
limits checked on the way: a file over either is refused and nothing of it stays. Only ``purpose:
batch`` is taken. A file belongs to its organisation: another's is a 404, as is one past its
``expires_at`` (expired files are deleted by the gateways' sweep).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import IO, Any

from api_gateway.openai.errors import invalid
from api_gateway.openai.pages import list_page
from api_gateway.services.errors import InvalidRequest, NotFound
from shared.db.openai_files import FileRecord, OpenAIFileRepository, UnknownFileCursor

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_EXPIRY_SECONDS",
    "EXPIRY_RANGE",
    "FileService",
    "check_expires_after",
    "file_object",
    "new_file_id",
]

CHUNK_BYTES = 1024 * 1024
"""Bytes per stored chunk (and per read of an upload)."""
DEFAULT_EXPIRY_SECONDS = 30 * 86_400
"""A ``batch`` file without ``expires_after`` expires 30 days after its upload, as at OpenAI."""
EXPIRY_RANGE = (3600, 30 * 86_400)
"""``expires_after.seconds`` (and a batch's ``output_expires_after.seconds``): 1 hour to 30 days."""
_PURPOSES = ("batch",)


def new_file_id() -> str:
    """A fresh file id: ``file-`` and 32 hex digits."""
    return f"file-{uuid.uuid4().hex}"


def check_expires_after(anchor: object, seconds: object, *, param: str) -> int:
    """The seconds of an ``expires_after`` (``{"anchor": "created_at", "seconds": N}``).

    Raises:
        InvalidRequest: another anchor, or seconds outside :data:`EXPIRY_RANGE` (400 naming ``param``).
    """
    if anchor != "created_at":
        raise invalid(f"{param}.anchor must be 'created_at'", (f"{param}.anchor",))
    if isinstance(seconds, str) and seconds.strip().isdigit():
        seconds = int(seconds)
    low, high = EXPIRY_RANGE
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not low <= seconds <= high:
        raise invalid(f"{param}.seconds must be an integer from {low} to {high}", (f"{param}.seconds",))
    return seconds


def file_object(record: FileRecord) -> dict[str, Any]:
    """The ``FileObject`` JSON of ``record``."""
    return {
        "id": record.file_id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": int(record.created_at.timestamp()),
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None if record.expires_at is None else int(record.expires_at.timestamp()),
        "status_details": None,
    }


class FileService:
    """Upload, list, read and delete the OpenAI face's files; built once per gateway."""

    def __init__(
        self, *, files: OpenAIFileRepository, max_bytes: int, max_lines: int, clock: Callable[[], datetime]
    ) -> None:
        self._files = files
        self._max_bytes = max_bytes
        self._max_lines = max_lines
        self._clock = clock

    def upload(
        self,
        data: IO[bytes] | None,
        *,
        filename: str | None,
        purpose: object,
        expires_after: tuple[object, object] | None,
        org_id: str,
    ) -> dict[str, Any]:
        """Store an uploaded file, chunk by chunk as it is read.

        Args:
            data: the file part's bytes (a spooled file), None when the form had no ``file``.
            filename: the part's file name.
            purpose: the form's ``purpose``.
            expires_after: the form's ``expires_after[anchor]`` and ``expires_after[seconds]``, if given.
            org_id: the caller's organisation.

        Returns:
            The ``FileObject``.

        Raises:
            InvalidRequest: no file, a purpose other than ``batch``, a bad ``expires_after``, or a file
                over ``APTIX_OPENAI_MAX_FILE_BYTES`` (``file_too_large``) or ``APTIX_OPENAI_MAX_FILE_LINES``
                (``too_many_lines``); nothing was stored.
        """
        if purpose is None:
            raise invalid("Missing required parameter: 'purpose'.", ("purpose",), code="missing_required_parameter")
        if purpose not in _PURPOSES:
            raise invalid(
                f"purpose {purpose!r} is not supported here: Aptix takes files for batches only (purpose 'batch')",
                ("purpose",),
            )
        if data is None:
            raise invalid("Missing required parameter: 'file'.", ("file",), code="missing_required_parameter")
        seconds = DEFAULT_EXPIRY_SECONDS
        if expires_after is not None:
            seconds = check_expires_after(*expires_after, param="expires_after")
        now = self._clock()
        record = FileRecord(
            file_id=new_file_id(), org_id=org_id, purpose=str(purpose), filename=(filename or "file")[:512],
            bytes=0, lines=0, created_at=now, expires_at=now + timedelta(seconds=seconds),
        )  # fmt: skip
        return file_object(self._files.create(record, _chunks(data), check=self._check_size))

    def get(self, file_id: str, *, org_id: str) -> FileRecord:
        """The caller's file.

        Raises:
            NotFound: no unexpired file ``file_id`` belongs to ``org_id``.
        """
        found = self._files.get(file_id, org_id=org_id, now=self._clock())
        if found is None:
            raise NotFound("not_found", f"No such File object: {file_id}")
        return found

    def content(self, record: FileRecord) -> Iterator[bytes]:
        """The file's bytes (an upload, or a batch's output or error file), a chunk at a time."""
        return self._files.chunks(record.file_id)

    def lines(self, record: FileRecord) -> Iterator[bytes]:
        """An upload's lines, read a chunk at a time."""
        return self._files.lines(record.file_id)

    def delete(self, file_id: str, *, org_id: str) -> dict[str, Any]:
        """Delete the caller's file (``FileDeleted``).

        Raises:
            NotFound: no such file of the caller's.
        """
        record = self.get(file_id, org_id=org_id)
        deleted = self._files.delete(record.file_id)
        return {"id": record.file_id, "object": "file", "deleted": deleted}

    def page(
        self, *, org_id: str, after: str | None, limit: int, ascending: bool, purpose: str | None
    ) -> dict[str, Any]:
        """A page of the caller's files (OpenAI's list shape).

        Raises:
            InvalidRequest: ``after`` names no file of the organisation.
        """
        try:
            rows, has_more = self._files.page(
                org_id, now=self._clock(), limit=limit, after=after, ascending=ascending, purpose=purpose
            )
        except UnknownFileCursor as exc:
            raise invalid(f"after: {after!r} is not a file of this organisation", ("after",)) from exc
        data = [file_object(row) for row in rows]
        return list_page(data, has_more=has_more)

    def delete_expired(self) -> int:
        """Delete files past their ``expires_at`` (some at a time); how many went."""
        return self._files.delete_expired(now=self._clock())

    def _check_size(self, size: int, lines: int) -> None:
        if size > self._max_bytes:
            raise InvalidRequest(
                f"the file is larger than {self._max_bytes} bytes (APTIX_OPENAI_MAX_FILE_BYTES)",
                [{"loc": ["body", "file"], "msg": "file too large", "type": "too_long"}],
                code="file_too_large",
            )
        if lines > self._max_lines:
            raise InvalidRequest(
                f"the file has more than {self._max_lines} lines (APTIX_OPENAI_MAX_FILE_LINES)",
                [{"loc": ["body", "file"], "msg": "too many lines", "type": "too_long"}],
                code="too_many_lines",
            )


def _chunks(data: IO[bytes]) -> Iterator[bytes]:
    while chunk := data.read(CHUNK_BYTES):
        yield chunk
