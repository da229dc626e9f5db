"""The OpenAI face's sweeps: batches past their window expire and files past their ``expires_at`` go,
even when nobody reads them (a read of a batch settles it too: ``OpenAIBatchService``); and, more
often (every few seconds), batches whose last request ended are noted ``finalizing`` and the batch
jobs nobody holds are taken up.

Every gateway runs them; each step is safe to run twice at once (the writes are conditional).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from api_gateway.openai.batch_jobs import BatchJobs
from api_gateway.openai.batch_service import OpenAIBatchService
from api_gateway.openai.file_service import FileService

__all__ = ["run_batch_jobs_forever", "sweep_batches_forever", "sweep_interval"]

logger = logging.getLogger(__name__)


def sweep_interval(window_seconds: float) -> float:
    """How often to sweep: a quarter of the completion window, from 1 s to a minute."""
    return min(60.0, max(1.0, window_seconds / 4))


async def sweep_batches_forever(batches: OpenAIBatchService, files: FileService, *, window_seconds: float) -> None:
    """Expire overdue batches and delete expired files, every :func:`sweep_interval` seconds.

    Args:
        batches: the service that expires batches.
        files: the service that deletes files.
        window_seconds: ``APTIX_OPENAI_BATCH_WINDOW_SECONDS``.
    """
    interval = sweep_interval(window_seconds)
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(batches.sweep)
            await run_in_threadpool(files.delete_expired)
        except Exception:  # a database blip must not end the sweep
            logger.warning("openai batch sweep failed", exc_info=True)


async def run_batch_jobs_forever(batches: OpenAIBatchService, jobs: BatchJobs) -> None:
    """Note the batches that ended and take up the batch jobs nobody holds, every :attr:`BatchJobs.poll_seconds`;
    stop the jobs when cancelled.

    Args:
        batches: the service that notes them (``OpenAIBatchService.poll_jobs``).
        jobs: this gateway's batch jobs.
    """
    try:
        while True:
            try:
                await run_in_threadpool(batches.poll_jobs)
            except Exception:  # a database blip must not end the polling
                logger.warning("openai batch jobs: polling failed", exc_info=True)
            await asyncio.sleep(jobs.poll_seconds)
    finally:
        await run_in_threadpool(jobs.stop)
