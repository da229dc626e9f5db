"""BatchJobs: the OpenAI face's long batch work, run off the request by any gateway, under a lease.

Two pieces of work on a batch of ``/openai/v1/batches`` take long (25 s for a 50,000-line file):
validating its input file and recording its turns, and writing its output and error files once its
last request ended. Neither runs inside a request. The batch's row says the job is due
(``OpenAIBatchRepository.due``); a gateway claims it with a lease (a token and an expiry on the row),
renews the lease while it works (every third of ``APTIX_OPENAI_BATCH_JOB_LEASE_SECONDS``, checked
every few hundred lines), and its end is a conditional write. A gateway that dies mid-job leaves the
lease to run out; any gateway's poll (:meth:`BatchJobs.run_due`, a few times per lease) claims the
job again and starts it afresh: validation records the Aptix batch in one transaction, and the files
with the batch's ``finished_at`` in one, so a job half done left nothing behind. A gateway stopped
in good order gives its jobs back at once, their attempt not counted.

Why gateways and not a Celery task: validation is the create endpoint's own checks (the gateway's
``parse_create``, ``TurnService.check_request``), and the workers never import the gateway. The lease
gives the same durability a task's redelivery would, and every gateway already sweeps these rows.

Each gateway runs at most ``APTIX_OPENAI_BATCH_JOB_THREADS`` jobs at once, on threads of its own (not
the request threadpool); a job it has no thread for waits for the next poll of any gateway.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from api_gateway.services.batch_service import BatchService
from shared.db.openai_batches import OpenAIBatchRecord, OpenAIBatchRepository
from shared.webhooks import WebhookSender

__all__ = ["BatchJobs", "JobPorts", "JobStopped", "Lease", "LeaseLost", "Work"]

logger = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another gateway took the job up (this one's lease ran out): drop it, writing nothing."""


class JobStopped(Exception):
    """The gateway is stopping: give the job back."""


class Lease:
    """The hold one job has on its batch: :meth:`keep` renews it when a third of it has passed."""

    def __init__(
        self,
        batch_id: str,
        token: str,
        *,
        batches: OpenAIBatchRepository,
        seconds: float,
        clock: Callable[[], datetime],
        stopping: threading.Event,
    ) -> None:
        self.batch_id = batch_id
        self.token = token
        self._batches = batches
        self._seconds = seconds
        self._clock = clock
        self._stopping = stopping
        self._renewed = clock()

    def keep(self, *, now: bool = False) -> None:
        """Renew the lease if a third of it passed (or ``now``).

        Raises:
            JobStopped: the gateway is stopping.
            LeaseLost: another holder has the job.
        """
        if self._stopping.is_set():
            raise JobStopped(self.batch_id)
        at = self._clock()
        if not now and at - self._renewed < timedelta(seconds=self._seconds / 3):
            return
        if not self._batches.renew(self.batch_id, token=self.token, until=at + timedelta(seconds=self._seconds)):
            raise LeaseLost(self.batch_id)
        self._renewed = at


class Work(Protocol):
    """The job itself (``OpenAIBatchService.run_job``): validate the batch, or write its files."""

    def __call__(self, record: OpenAIBatchRecord, lease: Lease) -> None:
        """Do the batch's job under ``lease``.

        Raises:
            LeaseLost: another gateway took the job over (this one wrote nothing).
            JobStopped: the gateway is stopping (this one wrote nothing).
        """


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPorts:
    """What both jobs of a batch (``batch_validation``, ``batch_files``) work with; built once per gateway."""

    batches: OpenAIBatchRepository
    """The OpenAI batches' rows: the job's lease, and the batch's end with its webhook event."""
    aptix: BatchService
    """The Aptix batch of the same id, and its turns."""
    clock: Callable[[], datetime]
    webhook_sender: WebhookSender | None = None
    """What sends the webhook events a job's end recorded (None: webhooks are off)."""

    def send(self, deliveries: list[str] | None) -> None:
        """Send the webhook events of the ``deliveries`` a job's end recorded (None or none: nothing to send)."""
        if deliveries and self.webhook_sender is not None:
            self.webhook_sender.send(deliveries)


class BatchJobs:
    """Claims due batch jobs and runs them on its threads; built once per gateway."""

    def __init__(
        self,
        *,
        batches: OpenAIBatchRepository,
        threads: int,
        lease_seconds: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._batches = batches
        self._threads = threads
        self._lease_seconds = lease_seconds
        self._clock = clock
        self._work: Work | None = None
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="openai-batch-job") if threads else None

    @property
    def poll_seconds(self) -> float:
        """How often a gateway looks for due jobs: a quarter of the lease, from 0.5 s to 5 s."""
        return min(5.0, max(0.5, self._lease_seconds / 4))

    def bind(self, work: Work) -> None:
        """Name the job's work (the service that runs it is built after this)."""
        self._work = work

    def submit(self, batch_id: str) -> None:
        """Run the batch's job on a free thread of this gateway, if it has one (else a later poll will)."""
        if self._pool is None or self._stopping.is_set():
            return
        with self._lock:
            if batch_id in self._running or len(self._running) >= self._threads:
                return
            self._running.add(batch_id)
        self._pool.submit(self._run_then_free, batch_id)

    def run_due(self) -> None:
        """Submit the due jobs this gateway has threads for."""
        if self._pool is None:
            return
        free = self._threads - len(self._running)
        if free <= 0:
            return
        for batch_id in self._batches.due(now=self._clock(), limit=free + len(self._running)):
            self.submit(batch_id)

    def drain(self) -> int:
        """Run every due job in the calling thread, until none is due (for tests and ``aptix dev``).

        Returns:
            How many it ran.
        """
        ran: set[str] = set()
        while (due := self._batches.due(now=self._clock(), limit=1)) and due[0] not in ran:
            ran.add(due[0])
            self._run(due[0])
        return len(ran)

    def stop(self) -> None:
        """Stop: jobs running give their batches back at their next lease check; wait for them."""
        self._stopping.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _run_then_free(self, batch_id: str) -> None:
        try:
            self._run(batch_id)
        except Exception:  # a database blip: the lease runs out and the job is claimed again
            logger.exception("openai batch %s: its job failed; it will be taken up again", batch_id)
        finally:
            with self._lock:
                self._running.discard(batch_id)

    def _run(self, batch_id: str) -> bool:
        """Claim the batch's job and run it; False if it was not due or held by another."""
        assert self._work is not None, "BatchJobs.bind was not called"
        token = secrets.token_hex(16)
        now = self._clock()
        record = self._batches.claim(batch_id, token=token, now=now, until=now + timedelta(seconds=self._lease_seconds))
        if record is None:
            return False
        lease = Lease(batch_id, token, batches=self._batches, seconds=self._lease_seconds, clock=self._clock,
                      stopping=self._stopping)  # fmt: skip
        try:
            self._work(record, lease)
        except LeaseLost:
            logger.warning("openai batch %s: another gateway took its job over", batch_id)
        except JobStopped:
            self._batches.release(batch_id, token=token, retry_at=self._clock(), counted=False)
            logger.info("openai batch %s: its job is given back (the gateway is stopping)", batch_id)
        return True
