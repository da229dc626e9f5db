"""A measured batch of Aptix turns: one ``POST /v1/batches``, waited on, client tools answered, results read.

:func:`submit` sends the batch; :func:`wait` polls its counts until every turn finished (or nothing
moved for a while), posting client tool results meanwhile; :func:`collect` reads the results. The
caller samples CPU between them, so reading the results is not counted.

For a client-tool scenario the bench finds the turns waiting for results with one SQL query on the
scratch database every 0.1 s (the cheapest way to learn it; its cost shows in the postgres column)
and posts each turn's results through the gateway (``POST /v1/turns/{id}/tool-results``) from a
few threads; the turn's latency includes that reaction.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

import psycopg

from aptix_cli import batch_progress
from aptix_cli.bench.scenarios import Scenario
from aptix_cli.bench.stats import RunFigures, run_figures
from aptix_cli.client import ApiClient, GatewayError
from aptix_cli.progress import ProgressBar
from shared.models.turn import TurnStatus

__all__ = ["Submitted", "ToolResultPoster", "TurnRun", "collect", "submit", "wait"]

_STALL_SECONDS = 180.0
_CLIENT_POLL_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Submitted:
    """A batch the bench sent."""

    batch_id: str
    turns: int
    started: float
    """Epoch seconds just before the ``POST``."""


@dataclass(frozen=True, slots=True)
class TurnRun:
    """The outcome of a batch."""

    scenario: Scenario
    submitted: Submitted
    figures: RunFigures
    statuses: dict[str, int]
    turn_ids: tuple[str, ...]
    """The completed turns, in request order."""

    @property
    def all_completed(self) -> bool:
        """Whether every turn of the batch completed."""
        return self.statuses.get(TurnStatus.COMPLETED, 0) == self.submitted.turns


def submit(api: ApiClient, scenario: Scenario, turns: int, *, first_index: int = 0) -> Submitted:
    """Send ``turns`` turns of ``scenario`` as one batch."""
    requests = [scenario.request(first_index + index) for index in range(turns)]
    started = time.time()
    batch = api.create_batch(requests)
    return Submitted(batch_id=str(batch["batch_id"]), turns=turns, started=started)


def wait(
    api: ApiClient, submitted: Submitted, *, poster: ToolResultPoster | None, progress: TextIO | None
) -> dict[str, int]:
    """Poll until every turn finished (:func:`aptix_cli.batch_progress.finished`) or none finished for a
    few minutes; returns the last counts.

    Args:
        api: the gateway.
        submitted: the batch.
        poster: answers the turns waiting for client tool results; None for scenarios without them.
        progress: where a progress bar goes (None: none).
    """
    bar = ProgressBar(progress, total=submitted.turns) if progress is not None else None
    interval = min(1.0, max(0.25, submitted.turns / 10_000))  # fewer count queries on a large batch
    counts: dict[str, int] = {}
    done, last_done, last_change, last_count = -1, -1, time.monotonic(), 0.0
    while True:
        now = time.monotonic()
        if poster is not None:
            poster.answer_waiting(submitted.batch_id)
        if now - last_count >= interval or poster is None:
            last_count = now
            counts = {str(status): int(count) for status, count in api.get_batch(submitted.batch_id)["counts"].items()}
            done = batch_progress.finished(counts)
            if bar is not None:
                bar.update(done, counts)
            if done >= submitted.turns:
                break
            if done != last_done:
                last_done, last_change = done, now
            elif now - last_change > _STALL_SECONDS:
                break
        time.sleep(_CLIENT_POLL_SECONDS if poster is not None else interval)
    if bar is not None:
        bar.finish(done, counts)
    return counts


def collect(api: ApiClient, scenario: Scenario, submitted: Submitted) -> TurnRun:
    """Read the batch's turns: statuses, latencies (created to completed) and throughput."""
    turns = api.batch_results(submitted.batch_id)
    statuses = Counter(str(turn["status"]) for turn in turns)
    completed = [turn for turn in turns if turn["status"] == "completed" and turn.get("completed_at")]
    created = [_epoch(turn["created_at"]) for turn in completed]
    finished = [_epoch(turn["completed_at"]) for turn in completed]
    return TurnRun(
        scenario=scenario,
        submitted=submitted,
        figures=run_figures(
            [end - start for start, end in zip(created, finished, strict=True)],
            started=submitted.started,
            finished=finished,
        ),
        statuses=dict(statuses),
        turn_ids=tuple(str(turn["turn_id"]) for turn in completed),
    )


class ToolResultPoster:
    """Finds the batch's turns waiting for client tool results and posts an output for each call.

    Args:
        api: the gateway.
        dsn: the scratch database (psycopg connection string).
        threads: concurrent posts.
    """

    def __init__(self, api: ApiClient, dsn: str, *, threads: int = 8) -> None:
        self._api = api
        self._connection = psycopg.connect(dsn, autocommit=True)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench-tool-results")
        self._posted: set[str] = set()
        self._pending: list[Future[None]] = []
        self.posted = 0
        """Turns whose results were accepted."""

    def answer_waiting(self, batch_id: str) -> None:
        """Post results for every waiting turn not answered yet (returns at once)."""
        rows = self._connection.execute(
            "SELECT turn_id, pending_tool_calls FROM turns WHERE batch_id = %s AND status = 'requires_client_tools'",
            (batch_id,),
        ).fetchall()
        for turn_id, calls in rows:
            if turn_id not in self._posted:
                self._posted.add(turn_id)
                self._pending.append(self._pool.submit(self._post, str(turn_id), calls))
        self._check_done()

    def close(self) -> None:
        """Wait for the posts in flight and close the connection."""
        self._pool.shutdown(wait=True)
        self._check_done()
        self._connection.close()

    def _post(self, turn_id: str, calls: Sequence[dict[str, Any]]) -> None:
        results = [{"call_id": str(call["call_id"]), "output": "42"} for call in calls]
        try:
            self._api.post_tool_results(turn_id, results)
        except GatewayError as exc:
            if exc.status != 409:  # 409: no longer waiting (answered already, or expired)
                raise

    def _check_done(self) -> None:
        still: list[Future[None]] = []
        for future in self._pending:
            if future.done():
                future.result()  # a failed post is a failed run, not a silent one
                self.posted += 1
            else:
                still.append(future)
        self._pending = still


def _epoch(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()
