"""``aptix bench --embedded``: the in-process measurement, for machines without Redis and PostgreSQL.

Figures are printed, never asserted. Starts the dev stack in this process (embedded services
unless ``APTIX_*`` URLs are set, so the same command measures real Redis and PostgreSQL), submits a
batch of plain turns, and prints turns/s, latency percentiles (queued to committed) and this
process's CPU time per turn.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from typing import Any

from aptix_cli.batch_progress import follow_batch
from aptix_cli.bench.stats import percentile, turn_latencies
from aptix_cli.client import ApiClient
from aptix_cli.dev import DevStack

__all__ = ["run_embedded_bench"]


def run_embedded_bench(*, turns: int, llm_latency_ms: float, worker_threads: int) -> int:
    """Measure and print; 0 when every turn completed."""
    from shared.logging import configure_logging

    configure_logging("ERROR")
    with tempfile.TemporaryDirectory(prefix="aptix-bench-") as folder:
        stack = DevStack(
            port=0,
            sqlite_path=os.path.join(folder, "bench.sqlite"),
            worker_threads=worker_threads,
            llm_latency_ms=llm_latency_ms,
        )
        info = stack.start()
        try:
            with ApiClient(info.url, key=info.api_key, timeout=120) as api:
                figures = _measure(api, turns)
        finally:
            stack.stop()
    embedded = ", ".join(info.embedded) or "none"
    _say(f"aptix bench: {turns} plain turns, {worker_threads} worker threads, model latency {llm_latency_ms:.0f} ms")
    _say(f"  embedded parts:    {embedded}")
    _say(f"  throughput:        {figures['rate']:.1f} turns/s ({figures['elapsed']:.1f} s)")
    _say(f"  latency p50/p95:   {figures['p50'] * 1000:.0f} / {figures['p95'] * 1000:.0f} ms (queued to committed)")
    _say(f"  CPU per turn:      {figures['cpu_ms']:.1f} ms (this process: gateway, workers, embedded services)")
    _say(f"  statuses:          {figures['statuses']}")
    return 0 if figures["completed"] == turns else 1


def _measure(api: ApiClient, turns: int) -> dict[str, Any]:
    cpu_before = _cpu_seconds()
    started = time.monotonic()
    batch = api.create_batch([{"input": f"bench {index}"} for index in range(turns)])
    batch = follow_batch(api, batch, interval=0.2)
    elapsed = time.monotonic() - started
    cpu = _cpu_seconds() - cpu_before
    results = api.batch_results(batch["batch_id"])
    latencies = turn_latencies(results)
    counts = batch["counts"]
    return {
        "elapsed": elapsed,
        "rate": turns / elapsed,
        "p50": percentile(latencies, 0.5) if latencies else 0.0,
        "p95": percentile(latencies, 0.95) if latencies else 0.0,
        "cpu_ms": cpu / turns * 1000,
        "completed": counts["completed"],
        "statuses": ", ".join(f"{status} {count}" for status, count in counts.items() if count),
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
