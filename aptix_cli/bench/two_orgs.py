"""``aptix bench --two-orgs``: two organisations' batches side by side (docs/batches.md, "Fair admission").

Organisation A submits a batch of ``--turns`` plain turns, then organisation B the same; both are
followed to the end. Printed, from the database's timestamps: each organisation's throughput over
the window both run (from B's batch accepted to the first batch's last completion), and each
batch's time to its first completed turn after its POST, and the latency (created to completed) of
interactive turns organisation A posts one a second while the batches run. Run it with ``APTIX_ORG_MAX_IN_FLIGHT`` set
very high (e.g. 1000000) to see the shape without admission: every turn released at once.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from datetime import datetime

import psycopg

from aptix_cli.bench import turn_runs
from aptix_cli.bench.interactive import InteractiveSample, interactive_latencies
from aptix_cli.bench.report import Report
from aptix_cli.bench.scenarios import SCENARIOS
from aptix_cli.bench.stats import percentile
from aptix_cli.client import ApiClient

__all__ = ["OrgFigures", "batch_figures", "completed_between", "overlap", "report_both_ran", "run_two_orgs"]


@dataclass(frozen=True, slots=True)
class OrgFigures:
    """One organisation's batch, from the database."""

    accepted: datetime
    first_done: datetime | None
    last_done: datetime | None
    completed: int


def run_two_orgs(api_a: ApiClient, api_b: ApiClient, *, turns: int, dsn: str, report: Report) -> bool:
    """Run both batches, print the figures; whether every turn of both completed."""
    submitted_a = turn_runs.submit(api_a, SCENARIOS["plain"], turns)
    submitted_b = turn_runs.submit(api_b, SCENARIOS["plain"], turns, first_index=turns)
    counts: dict[str, dict[str, int]] = {}

    def follow(name: str, api: ApiClient, submitted: turn_runs.Submitted) -> None:
        counts[name] = turn_runs.wait(api, submitted, poster=None, progress=sys.stderr if name == "a" else None)

    threads = [
        threading.Thread(target=follow, args=("a", api_a, submitted_a)),
        threading.Thread(target=follow, args=("b", api_b, submitted_b)),
    ]
    for thread in threads:
        thread.start()
    # Interactive turns of the busier organisation while both batches run: never held, top priority.
    interactive = interactive_latencies(
        api_a, seconds=float("inf"), per_second=1.0, stop=lambda: not all(thread.is_alive() for thread in threads)
    )
    for thread in threads:
        thread.join()
    with psycopg.connect(dsn, autocommit=True) as db:
        a, b = batch_figures(db, submitted_a.batch_id), batch_figures(db, submitted_b.batch_id)
        window = overlap(a, b)
        in_window = {
            name: completed_between(db, batch_id, *window) if window else 0
            for name, batch_id in (("a", submitted_a.batch_id), ("b", submitted_b.batch_id))
        }
    report.line()
    report.line(f"two organisations, a batch of {turns} plain turns each, B submitted right after A")
    report_both_ran(report, window, in_window)
    report.field("interactive turns of A", _interactive_cell(interactive))
    for name, figures in (("A", a), ("B", b)):
        first = "none" if figures.first_done is None else f"{_after(figures.first_done, figures.accepted)} s"
        total = "" if figures.last_done is None else f", all done {_after(figures.last_done, figures.accepted)} s"
        report.field(f"org {name}", f"first turn completed {first} after its batch was accepted{total}")
    return a.completed == turns and b.completed == turns and interactive.all_completed


def batch_figures(db: psycopg.Connection[tuple[object, ...]], batch_id: str) -> OrgFigures:
    """One batch's figures from its turns' timestamps."""
    row = db.execute(
        "SELECT min(created_at), min(completed_at), max(completed_at), count(*) FILTER (WHERE status = 'completed') "
        "FROM turns WHERE batch_id = %s",
        (batch_id,),
    ).fetchone()
    assert row is not None
    accepted, first, last, completed = row
    assert isinstance(accepted, datetime)
    return OrgFigures(accepted, first if isinstance(first, datetime) else None,
                      last if isinstance(last, datetime) else None, int(str(completed)))  # fmt: skip


def report_both_ran(report: Report, window: tuple[datetime, datetime] | None, in_window: dict[str, int]) -> None:
    """The turns/s of A and B while both ran (``window``, from :func:`overlap`; nothing if they never did)
    and B/A: how evenly the two organisations shared the workers."""
    if window is None:
        return
    seconds = (window[1] - window[0]).total_seconds()
    rate_a, rate_b = in_window["a"] / seconds, in_window["b"] / seconds
    report.field(
        "while both ran",
        f"{seconds:.1f} s: A {rate_a:.1f} turns/s ({in_window['a']} turns), B {rate_b:.1f} turns/s "
        f"({in_window['b']} turns); B/A {rate_b / rate_a if rate_a else float('inf'):.2f}",
    )


def overlap(a: OrgFigures, b: OrgFigures) -> tuple[datetime, datetime] | None:
    """From the later batch's acceptance to the earlier batch's last completion (None if they never overlapped)."""
    if a.last_done is None or b.last_done is None:
        return None
    start, end = max(a.accepted, b.accepted), min(a.last_done, b.last_done)
    return (start, end) if end > start else None


def completed_between(db: psycopg.Connection[tuple[object, ...]], batch_id: str, start: datetime, end: datetime) -> int:
    """How many of the batch's turns completed in ``(start, end]``."""
    row = db.execute(
        "SELECT count(*) FROM turns WHERE batch_id = %s AND completed_at > %s AND completed_at <= %s",
        (batch_id, start, end),
    ).fetchone()
    return 0 if row is None else int(str(row[0]))


def _interactive_cell(sample: InteractiveSample) -> str:
    if not sample.latencies:
        return f"none completed ({sample.started} started)"
    p50, p95, worst = (percentile(sample.latencies, q) * 1000 for q in (0.5, 0.95, 1.0))
    return (
        f"created to completed p50 {p50:.0f} ms, p95 {p95:.0f} ms, max {worst:.0f} ms "
        f"({len(sample.latencies)} of {sample.started} completed)"
    )


def _after(when: datetime, since: datetime) -> str:
    return f"{(when - since).total_seconds():.1f}"
