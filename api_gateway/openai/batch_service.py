"""OpenAIBatchService: OpenAI's Batch API over Aptix batches (``/openai/v1/batches``).

Creating a batch records its row (``validating``) and answers at once; the batch's job (``batch_jobs``,
run by this gateway at once if it has a free thread, else by the next poll of any gateway) then
validates its input file and records its turns as the Aptix batch of the same id (``batch_validation``):
``in_progress``, or ``failed`` naming its bad lines.

Everything after is read from the turns (``batch_view``). The first read (or sweep) that finds its
last request ended notes it (``finalizing``), and the batch's job writes its output and error files
(``batch_files``): then it is ``completed``, ``cancelled`` or ``expired``. A batch past its
``expires_at`` with requests still queued or running is noted expired and those requests are
cancelled, on the next read or by the gateways' sweep, whichever comes first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from api_gateway.ids import is_batch_id, new_batch_id
from api_gateway.openai.batch_files import BatchFiles
from api_gateway.openai.batch_jobs import BatchJobs, Lease
from api_gateway.openai.batch_validation import ENDPOINT, BatchValidation
from api_gateway.openai.batch_view import batch_object
from api_gateway.openai.errors import invalid
from api_gateway.openai.file_service import FileService, check_expires_after
from api_gateway.openai.idempotency import check_key, check_repeat
from api_gateway.openai.pages import list_page
from api_gateway.openai.requests import check_metadata
from api_gateway.services.batch_service import BatchService
from api_gateway.services.errors import Conflict, NotFound
from api_gateway.services.turn_service import TurnService
from shared.db.batches import BatchRepository
from shared.db.openai_batches import (
    OpenAIBatchKeyTaken,
    OpenAIBatchRecord,
    OpenAIBatchRepository,
    UnknownBatchCursor,
)
from shared.models.turn import TurnStatus

__all__ = ["OpenAIBatchService"]

logger = logging.getLogger(__name__)

COMPLETION_WINDOW = "24h"
_KNOWN = frozenset(
    {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after", "webhook_url"}
)
_MAX_KEY = 255


class OpenAIBatchService:
    """The Batch API of the OpenAI face; built once per gateway."""

    def __init__(
        self,
        *,
        batches: OpenAIBatchRepository,
        aptix: BatchService,
        aptix_batches: BatchRepository,
        turns: TurnService,
        files: FileService,
        jobs: BatchJobs,
        validation: BatchValidation,
        batch_files: BatchFiles,
        window_seconds: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._batches = batches
        self._aptix = aptix
        self._aptix_batches = aptix_batches
        self._turns = turns
        self._files = files
        self._jobs = jobs
        self._validation = validation
        self._batch_files = batch_files
        self._window = timedelta(seconds=window_seconds)
        self._clock = clock
        jobs.bind(self.run_job)

    def create(self, body: object, *, org_id: str, user_id: str, idempotency_key: str | None) -> dict[str, Any]:
        """Create a batch on an uploaded file: record it ``validating`` and start its validation.

        Args:
            body: the decoded JSON body.
            org_id: the caller's organisation.
            user_id: the caller.
            idempotency_key: the ``Idempotency-Key`` header, if any.

        Returns:
            The ``Batch``, ``validating`` (its job validates it and records its turns: ``batch_validation``);
            for a repeated key with the same body, the first one as it stands.

        Raises:
            InvalidRequest: the body (400 naming the field): an endpoint other than ``/v1/responses``, a
                completion window other than ``24h``, a file not uploaded for ``batch``, a webhook URL refused.
            NotFound: ``input_file_id`` names no file of the organisation.
            Conflict: ``idempotency_key_reused``.
        """
        fields = _check_body(body)
        if idempotency_key is not None:
            check_key(idempotency_key, max_chars=_MAX_KEY)
            earlier = self._batches.by_idempotency_key(org_id, idempotency_key)
            if earlier is not None:
                return self._replay(earlier, fields["request_hash"])
        try:
            source = self._files.get(fields["input_file_id"], org_id=org_id)
        except NotFound as exc:
            raise NotFound(
                "not_found", f"No such File object: {fields['input_file_id']}",
                [{"loc": ["body", "input_file_id"], "msg": "unknown file", "type": "value_error"}],
            ) from exc  # fmt: skip
        if source.purpose != "batch":
            raise invalid(f"file {source.file_id!r} was not uploaded for purpose 'batch'", ("input_file_id",))
        self._aptix.check_webhook_url(fields["webhook_url"], org_id=org_id)
        batch_id = new_batch_id()
        now = self._clock()
        record = OpenAIBatchRecord(
            batch_id=batch_id, org_id=org_id, user_id=user_id, input_file_id=source.file_id, endpoint=ENDPOINT,
            completion_window=COMPLETION_WINDOW, client_metadata=fields["metadata"],
            output_expires_seconds=fields["output_expires_seconds"], webhook_url=fields["webhook_url"],
            idempotency_key=idempotency_key, request_hash=fields["request_hash"], created_at=now,
            expires_at=now + self._window,
        )  # fmt: skip
        try:
            self._batches.add(record)
        except OpenAIBatchKeyTaken:
            winner = self._batches.by_idempotency_key(org_id, str(idempotency_key))
            if winner is None:
                raise Conflict(
                    "idempotency_key_reused", "a concurrent request with this Idempotency-Key failed; retry"
                ) from None
            return self._replay(winner, fields["request_hash"])
        self._jobs.submit(batch_id)
        return batch_object(record, None, None)

    def get(self, batch_id: str, *, org_id: str) -> dict[str, Any]:
        """The caller's batch as it stands (``Batch``).

        Raises:
            NotFound: no such batch of the caller's organisation.
        """
        return self._view(self._require(batch_id, org_id=org_id))

    def cancel(self, batch_id: str, *, org_id: str) -> dict[str, Any]:
        """Cancel the batch: its requests not started are cancelled at once, running ones finish.

        A batch still validating records no turn (``cancelling``, then ``cancelled``); one that ended (or
        failed) is returned as it is; a second cancel answers the batch as it stands.

        Raises:
            NotFound: no such batch of the caller's organisation.
        """
        record = self._settle(self._require(batch_id, org_id=org_id))
        if record.in_progress_at is None:
            if self._batches.request_cancel(batch_id, at=self._clock()):
                self._jobs.submit(batch_id)  # its validation, if it runs here, records nothing
        elif record.failed_at is None and record.ended_at is None:
            with contextlib.suppress(Conflict):  # every request had ended meanwhile
                self._aptix.cancel(batch_id, org_id=org_id, running="finish")
        return self._view(self._reread(record))

    def page(self, *, org_id: str, after: str | None, limit: int) -> dict[str, Any]:
        """A page of the caller's batches, newest first (OpenAI's list shape).

        Raises:
            InvalidRequest: ``after`` names no batch of the organisation.
        """
        try:
            rows, has_more = self._batches.page(org_id, limit=limit, after=after)
        except UnknownBatchCursor as exc:
            raise invalid(f"after: {after!r} is not a batch of this organisation", ("after",)) from exc
        data = [self._view(row) for row in rows]
        return list_page(data, has_more=has_more)

    def run_job(self, record: OpenAIBatchRecord, lease: Lease) -> None:
        """The batch's job (``BatchJobs`` runs it under ``lease``): validate it, or write its files once it ended."""
        if record.in_progress_at is None:
            self._validation.run(record, lease)
        else:
            self._batch_files.run(record, lease)

    def sweep(self) -> int:
        """Expire the batches past their window.

        Returns:
            How many batches it settled.
        """
        settled = 0
        for record in self._batches.overdue(now=self._clock()):
            self._settle(record)
            settled += 1
        return settled

    def poll_jobs(self) -> None:
        """Note the end of the batches whose last request ended (their files are to be written), then take
        up the batch jobs nobody holds (``BatchJobs.run_due``)."""
        for batch_id in self._batches.ended_unnoted():
            self._settle(self._batches.get_any(batch_id))
        self._jobs.run_due()

    def _require(self, batch_id: str, *, org_id: str) -> OpenAIBatchRecord:
        found = self._batches.get(batch_id, org_id=org_id) if is_batch_id(batch_id) else None
        if found is None:
            raise NotFound("not_found", f"No such Batch object: {batch_id}")
        return found

    def _replay(self, earlier: OpenAIBatchRecord, request_hash: str) -> dict[str, Any]:
        check_repeat(earlier.request_hash, request_hash)
        return self._view(earlier)

    def _settle(self, record: OpenAIBatchRecord) -> OpenAIBatchRecord:
        """Bring the batch's record up to what its turns say: expired (its requests cancelled), ended."""
        if record.in_progress_at is None or record.ended_at is not None or record.failed_at is not None:
            return record
        now = self._clock()
        counts = self._aptix_batches.counts(record.batch_id)
        moving = any(counts[status] for status in TurnStatus.in_flight())
        if moving and record.expired_at is None and record.expires_at <= now:
            self._expire(record)
            record = self._reread(record)
            counts = self._aptix_batches.counts(record.batch_id)
            moving = any(counts[status] for status in TurnStatus.in_flight())
        if not moving:
            ended_at = self._batches.totals(record.batch_id).last_end or now
            if self._batches.note_ended(record.batch_id, at=ended_at):
                self._jobs.submit(record.batch_id)
            record = self._reread(record)
        return record

    def _expire(self, record: OpenAIBatchRecord) -> None:
        """Note the batch expired, then cancel its requests still queued or running."""
        if not self._batches.note_expired(record.batch_id, at=record.expires_at):
            return
        logger.info("openai batch %s expired; cancelling its unfinished requests", record.batch_id)
        try:
            self._aptix.cancel(record.batch_id, org_id=record.org_id, running="finish")
        except Conflict:
            return  # every request had ended meanwhile
        for turn_id in self._aptix_batches.turn_ids(record.batch_id, statuses=(TurnStatus.RUNNING,)):
            try:
                self._turns.cancel(turn_id, org_id=record.org_id)
            except Conflict:
                continue  # it ended meanwhile

    def _reread(self, record: OpenAIBatchRecord) -> OpenAIBatchRecord:
        found = self._batches.get(record.batch_id, org_id=record.org_id)
        assert found is not None
        return found

    def _view(self, record: OpenAIBatchRecord) -> dict[str, Any]:
        record = self._settle(record)
        if record.in_progress_at is None or record.finished_at is not None:
            totals = None if record.in_progress_at is None else self._batches.totals(record.batch_id)
            return batch_object(record, None, totals)
        counts = self._aptix_batches.counts(record.batch_id)
        return batch_object(record, counts, self._batches.totals(record.batch_id))


def _check_body(body: object) -> dict[str, Any]:
    """The create request's fields, checked (400 naming the field otherwise)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", ())
    for name in body:
        if name not in _KNOWN:
            raise invalid(f"Unknown parameter: {name!r}.", (name,), code="unknown_parameter")
    for name in ("input_file_id", "endpoint", "completion_window"):
        if body.get(name) is None:
            raise invalid(f"Missing required parameter: {name!r}.", (name,), code="missing_required_parameter")
    file_id = body["input_file_id"]
    if not isinstance(file_id, str) or not file_id:
        raise invalid("input_file_id must be a file id", ("input_file_id",))
    if body["endpoint"] != ENDPOINT:
        raise invalid(
            f"endpoint {body['endpoint']!r} is not supported here: Aptix batches run {ENDPOINT!r} only",
            ("endpoint",),
        )
    if body["completion_window"] != COMPLETION_WINDOW:
        raise invalid(f"completion_window must be {COMPLETION_WINDOW!r}", ("completion_window",))
    seconds = None
    expiry = body.get("output_expires_after")
    if expiry is not None:
        if not isinstance(expiry, dict):
            raise invalid("output_expires_after must be {anchor, seconds}", ("output_expires_after",))
        seconds = check_expires_after(expiry.get("anchor"), expiry.get("seconds"), param="output_expires_after")
    webhook_url = body.get("webhook_url")
    if webhook_url is not None and (not isinstance(webhook_url, str) or not webhook_url):
        raise invalid("webhook_url must be a URL", ("webhook_url",))
    metadata = body.get("metadata")
    return {
        "input_file_id": file_id,
        "metadata": None if metadata is None else check_metadata(metadata),
        "output_expires_seconds": seconds,
        "webhook_url": webhook_url,
        "request_hash": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
    }
