"""BatchValidation: the job that reads a batch's input file and records its turns, or fails the batch.

Run by a gateway off the request (``batch_jobs``), under a lease. Every line of the input file is
checked (``batch_lines``); while none is bad, each is staged as a turn of the OpenAI face (its extras
carry its ``custom_id``). A file with a bad line makes the batch ``failed`` with every bad line in
``errors.data`` (the first :data:`MAX_ERRORS`), and nothing runs; a valid one becomes the Aptix batch
of the same id (``BatchService.commit``: every turn in one transaction), so its turns go through fair
admission, the model rate limits and the batch priority like any batch turn; then the batch is
``in_progress``.

Started again after an interruption, it finds what the last holder left: the Aptix batch recorded
(only ``in_progress`` was not noted: it notes it) or nothing (it validates afresh). A batch whose
validation was taken up :data:`MAX_ATTEMPTS` times without ending fails ``validation_interrupted``;
one cancelled while validating records nothing and ends ``cancelled``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from api_gateway.openai.batch_jobs import JobPorts, Lease
from api_gateway.openai.batch_lines import BatchLine, LineError, check_line
from api_gateway.openai.errors import param_of
from api_gateway.openai.file_service import FileService
from api_gateway.openai.response_service import ResponseService
from api_gateway.openai.turn_requests import turn_parts
from api_gateway.services.batch_staging import StagedBatch
from api_gateway.services.errors import Conflict, NotFound, ServiceError, Unavailable
from shared.db.batches import BatchRepository
from shared.db.openai_batches import OpenAIBatchRecord
from shared.db.openai_files import FileRecord
from shared.webhooks import EventType

__all__ = ["ENDPOINT", "MAX_ATTEMPTS", "MAX_ERRORS", "BatchValidation"]

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/responses"
"""The one endpoint a batch here may name."""
MAX_ERRORS = 1000
"""The most bad lines a failed batch's ``errors.data`` lists (the first ones)."""
MAX_ATTEMPTS = 3
"""How many times a batch's validation is taken up before it fails ``validation_interrupted``."""
_KEEP_EVERY = 200
"""Lines between two lease checks."""
_RETRY_AFTER = timedelta(seconds=5)
"""How long a validation whose recording the broker or the state store refused waits before its next attempt."""


class BatchValidation:
    """Validates batches and records their turns; built once per gateway."""

    def __init__(
        self, ports: JobPorts, *, aptix_batches: BatchRepository, files: FileService, responses: ResponseService
    ) -> None:
        self._ports = ports
        self._batches = ports.batches
        self._aptix = ports.aptix
        self._clock = ports.clock
        self._aptix_batches = aptix_batches
        self._files = files
        self._responses = responses

    def run(self, record: OpenAIBatchRecord, lease: Lease) -> None:
        """Validate the batch and record its turns, or fail it; or finish what an interrupted run left.

        Raises: as :class:`~api_gateway.openai.batch_jobs.Work`.
        """
        batch_id, org_id = record.batch_id, record.org_id
        recorded = self._aptix_batches.get(batch_id, org_id=org_id)
        if recorded is not None:  # the last holder stopped between the Aptix batch and noting it
            self._start(record, total=recorded.total, at=recorded.created_at)
            return
        if record.cancel_requested_at is not None:
            deliveries = self._batches.finish(batch_id, at=self._clock(), files=(),
                                              event=EventType.BATCH_CANCELLED.value)  # fmt: skip
            self._ports.send(deliveries)
            return
        if record.job_attempts > MAX_ATTEMPTS:
            message = (f"The batch's validation was interrupted {MAX_ATTEMPTS} times (its gateways stopped); "
                       "create it again.")  # fmt: skip
            self._fail(batch_id, errors=[LineError(0, "validation_interrupted", message)], total=0)
            return
        try:
            source = self._files.get(record.input_file_id, org_id=org_id)
        except NotFound:
            message = f"The input file {record.input_file_id!r} was deleted before the batch was validated."
            self._fail(batch_id, errors=[LineError(0, "file_not_found", message, "input_file_id")], total=0)
            return
        try:
            with self._aptix.stage(batch_id, org_id=org_id, user_id=record.user_id,
                                   webhook_url=record.webhook_url) as staged:  # fmt: skip
                errors, count = self._stage_lines(source, staged, lease)
                if errors or count == 0:
                    if count == 0:
                        errors = [LineError(0, "empty_file", "The input file holds no request.", "input_file_id")]
                    self._fail(batch_id, errors=errors, total=count)
                    return
                lease.keep(now=True)  # still this job's, just before its turns are recorded
                self._aptix.commit(staged, batch_id=batch_id, org_id=org_id, user_id=record.user_id,
                                   webhook_url=record.webhook_url, idempotency_key=None)  # fmt: skip
        except Unavailable:
            logger.warning("openai batch %s: the broker or the state store refused its turns; retrying", batch_id)
            self._batches.release(batch_id, token=lease.token, retry_at=self._clock() + _RETRY_AFTER, counted=False)
            return
        except Conflict:  # the Aptix batch of this id was recorded meanwhile (by a holder whose lease ran out)
            found = self._aptix_batches.get(batch_id, org_id=org_id)
            if found is None:
                raise
            count = found.total
        except ServiceError as exc:  # a setting changed since the create (its webhook_url is now refused)
            self._fail(batch_id, errors=[LineError(0, exc.code, exc.message)], total=0)
            return
        self._start(record, total=count, at=self._clock())
        logger.info("openai batch %s: %d requests", batch_id, count)

    def _start(self, record: OpenAIBatchRecord, *, total: int, at: datetime) -> None:
        """Note the batch in progress; cancel its Aptix batch if it was cancelled while validating."""
        if self._batches.start(record.batch_id, total=total, at=at) is not None:
            try:
                self._aptix.cancel(record.batch_id, org_id=record.org_id, running="finish")
            except Conflict:
                return  # every request had ended meanwhile

    def _stage_lines(self, source: FileRecord, staged: StagedBatch, lease: Lease) -> tuple[list[LineError], int]:
        """Check every line of ``source``; stage the valid ones while none was bad.

        Returns:
            The bad lines (the first :data:`MAX_ERRORS`) and how many requests the file holds.
        """
        errors: list[LineError] = []
        seen: set[str] = set()
        count = 0
        for number, raw in enumerate(self._files.lines(source), start=1):
            if number % _KEEP_EVERY == 0:
                lease.keep()
            if not raw.strip():
                continue
            count += 1
            checked = check_line(raw, number, endpoint=ENDPOINT, seen=seen, check_request=self._responses.check_model)
            if isinstance(checked, LineError):
                if len(errors) < MAX_ERRORS:
                    errors.append(checked)
                continue
            if errors:
                continue  # the batch fails: what is left is only checked
            try:
                self._stage(checked, staged)
            except ServiceError as exc:
                if len(errors) < MAX_ERRORS:
                    errors.append(LineError(number, exc.code, exc.message, _param(exc.details)))
        return errors, count

    def _stage(self, line: BatchLine, staged: StagedBatch) -> None:
        request = line.request
        echo = request.echoed(self._responses.model_for(request, mode=request.mode))
        turn_request, extras = turn_parts(
            request, session_id=None, idempotency_key=None, custom_id=line.custom_id, echo=echo
        )
        staged.add(turn_request, loc=("line", line.number), extras=extras)

    def _fail(self, batch_id: str, *, errors: list[LineError], total: int) -> None:
        deliveries = self._batches.fail(batch_id, errors=[error.as_json() for error in errors], total=total,
                                        at=self._clock())  # fmt: skip
        self._ports.send(deliveries)


def _param(details: Any) -> str | None:
    """``body.<param>`` of a line a staging check refused (``loc`` ``["line", n, field, ...]``)."""
    if isinstance(details, list) and details and isinstance(details[0], dict):
        loc = details[0].get("loc")
        if isinstance(loc, list | tuple) and len(loc) > 2:
            inner = param_of(list(loc[2:]))
            return None if inner is None else f"body.{inner}"
    return None
