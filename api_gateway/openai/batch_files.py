"""BatchFiles: the job that writes a batch's output and error files once its last request ended.

Run by a gateway off the request (``batch_jobs``), under a lease, while the batch is ``finalizing``.
Both files' lines are rendered in one pass over the batch's turns as they stand (``batch_output``, 500
turns a query), each into a temporary file (memory up to 1 MiB, then disk), then copied into the file store in
chunks of a mebibyte, both files with the batch's ``finished_at`` and its webhook event in one
transaction. What the files hold is frozen then: a request paused for client tools is in the output
file (a completed ``Response`` ending in ``function_call`` items) and stays there even if its turn
later times out or is cancelled, and each file's ``bytes`` and the batch's ``request_counts`` are what
was written. A job interrupted before that transaction leaves nothing and is run again.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import IO

from api_gateway.openai.batch_jobs import JobPorts, Lease
from api_gateway.openai.batch_output import Part, render_line
from api_gateway.openai.file_service import CHUNK_BYTES, DEFAULT_EXPIRY_SECONDS, new_file_id
from shared.db.openai_batches import FinishedFile, OpenAIBatchRecord
from shared.db.openai_files import FileRecord
from shared.webhooks import EventType

__all__ = ["BatchFiles"]

_KEEP_EVERY = 500
"""Turns read between two lease checks."""
_PARTS: tuple[Part, ...] = ("output", "error")


class BatchFiles:
    """Writes ended batches' files; built once per gateway."""

    def __init__(self, ports: JobPorts) -> None:
        self._ports = ports

    def run(self, record: OpenAIBatchRecord, lease: Lease) -> None:
        """Render the batch's two files and record them with its end (unless another holder did first).

        Raises: as :class:`~api_gateway.openai.batch_jobs.Work`.
        """
        batches, aptix, clock = self._ports.batches, self._ports.aptix, self._ports.clock
        now = clock()
        seconds = record.output_expires_seconds or DEFAULT_EXPIRY_SECONDS
        expired = record.expired_at is not None
        cancelled_at = aptix.require(record.batch_id, org_id=record.org_id).cancel_requested_at
        spools: dict[Part, IO[bytes]] = {}
        lines: Counter[Part] = Counter()
        try:
            for part in _PARTS:
                spools[part] = tempfile.SpooledTemporaryFile(max_size=CHUNK_BYTES)  # noqa: SIM115  # closed below
            for scanned, turn in enumerate(aptix.turns(record.batch_id), start=1):
                rendered = render_line(turn, expired=expired, cancelled_at=cancelled_at)
                if rendered is not None:
                    part, line = rendered
                    spools[part].write(line)
                    lines[part] += 1
                if scanned % _KEEP_EVERY == 0:
                    lease.keep()
            files = []
            for part in _PARTS:
                if lines[part]:
                    file = FileRecord(
                        file_id=new_file_id(), org_id=record.org_id, purpose="batch_output",
                        filename=f"{record.batch_id}_{part}.jsonl", bytes=0, lines=0, created_at=now,
                        expires_at=now + timedelta(seconds=seconds), batch_id=record.batch_id, batch_part=part,
                    )  # fmt: skip
                    files.append(FinishedFile(file, _chunks(spools[part])))
            lease.keep(now=True)  # still this job's, just before the files are recorded
            event = _event(expired=expired, cancelled=cancelled_at is not None)
            deliveries = batches.finish(record.batch_id, at=clock(), files=files, event=event)
        finally:
            for spool in spools.values():
                spool.close()
        self._ports.send(deliveries)


def _event(*, expired: bool, cancelled: bool) -> str:
    if expired:
        return EventType.BATCH_EXPIRED.value
    return EventType.BATCH_CANCELLED.value if cancelled else EventType.BATCH_COMPLETED.value


def _chunks(spool: IO[bytes]) -> Iterator[bytes]:
    spool.seek(0)
    while chunk := spool.read(CHUNK_BYTES):
        yield chunk
