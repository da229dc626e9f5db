"""A batch of the OpenAI face seen through OpenAI's ``Batch`` type.

Its status comes from its record while it validates (``validating``; ``cancelling``, ``cancelled``
when cancelled then; ``failed``) and once it ended (``finalizing`` while its files are written, then
``completed``, ``cancelled`` or ``expired``), and in between from its turns, live: some turn queued
or running: ``in_progress`` (``cancelling`` after a cancel, ``finalizing`` in the moment between its
expiry and the cancel of its last running turn). A turn paused for client tools counts as ended (its
response is completed).

``request_counts.completed`` counts the requests of the output file, ``failed`` those of the error
file: live from the turns while it runs, then what the files hold. ``usage`` adds up the tokens of
every turn. ``finalizing_at`` is when its last request ended; ``completed_at`` (``cancelled_at``) when
its files were written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from shared.db.openai_batches import BatchTotals, OpenAIBatchRecord
from shared.models.turn import TurnStatus

__all__ = ["ENDED", "batch_object", "batch_status"]

ENDED = frozenset({"failed", "completed", "expired", "cancelled"})
"""A batch in one of these no longer changes."""


def batch_status(record: OpenAIBatchRecord, counts: dict[TurnStatus, int] | None, *, cancelling: bool) -> str:
    """Where the batch stands.

    Args:
        record: the batch.
        counts: its turns by status (None: no Aptix batch yet, or its files are written).
        cancelling: whether it (or its Aptix batch) was asked to cancel.
    """
    if record.failed_at is not None:
        return "failed"
    if record.in_progress_at is None:
        if record.finished_at is not None:
            return "cancelled"  # while validating: it recorded nothing
        return "cancelling" if cancelling else "validating"
    if record.finished_at is not None:
        if record.expired_at is not None:
            return "expired"
        return "cancelled" if cancelling else "completed"
    moving = counts is not None and any(counts[status] for status in TurnStatus.in_flight())
    if not moving or record.ended_at is not None or record.expired_at is not None:
        return "finalizing"
    return "cancelling" if cancelling else "in_progress"


def batch_object(
    record: OpenAIBatchRecord, counts: dict[TurnStatus, int] | None, totals: BatchTotals | None
) -> dict[str, Any]:
    """The ``Batch`` JSON of ``record``.

    Args:
        record: the batch.
        counts: its turns by status (None: no Aptix batch yet, or its files are written).
        totals: what its turns add up to (None: no Aptix batch).
    """
    cancel_at = record.cancel_requested_at or (None if totals is None else totals.cancel_requested_at)
    status = batch_status(record, counts, cancelling=cancel_at is not None)
    completed, failed = record.completed_count, record.failed_count
    if counts is not None and record.finished_at is None:
        completed = counts[TurnStatus.COMPLETED] + counts[TurnStatus.REQUIRES_CLIENT_TOOLS]
        failed = counts[TurnStatus.FAILED] + counts[TurnStatus.CANCELLED]
    usage = None
    if totals is not None:
        usage = {
            "input_tokens": totals.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": totals.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": totals.input_tokens + totals.output_tokens,
        }
    finished = record.finished_at if status in ENDED else None
    return {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": None if record.errors is None else {"object": "list", "data": record.errors},
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": status,
        "output_file_id": record.output_file_id if status in ENDED else None,
        "error_file_id": record.error_file_id if status in ENDED else None,
        "created_at": _unix(record.created_at),
        "in_progress_at": _unix(record.in_progress_at),
        "expires_at": _unix(record.expires_at),
        "finalizing_at": _unix(record.ended_at) if record.in_progress_at is not None else None,
        "completed_at": _unix(finished) if status == "completed" else None,
        "failed_at": _unix(record.failed_at),
        "expired_at": _unix(record.expired_at),
        "cancelling_at": _unix(cancel_at),
        "cancelled_at": _unix(finished) if status == "cancelled" else None,
        "request_counts": {"total": record.total, "completed": completed, "failed": failed},
        "usage": usage,
        "metadata": record.client_metadata,
        "model": None,
    }


def _unix(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp())
