"""What one counted event costs a worker: the CPU time of WorkerMetrics' calls, per call and per event.

A worker runs about 1,000 tasks a second at most (FIELD-NOTES), so a few µs per event stays well
under 1 % of a task. Run from the repo root::

    .venv/bin/python benchmarks/metrics_cost.py                 # both modes, 200,000 calls each
    .venv/bin/python benchmarks/metrics_cost.py --calls 1000000

Each mode runs in a fresh child interpreter: ``multiprocess`` as ``aptix worker`` counts (memory-
mapped files in a fresh directory, ``aptix_cli.metrics_dir``), ``memory`` as tests and ``aptix dev``
count. An event is one counter increment or one histogram observation: a message of one step is
one event, a model call that returned with tokens is three.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Run every mode in a child interpreter and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--mode", choices=["multiprocess", "memory"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        _measure(args.mode, args.calls)
        return 0
    for mode in ("multiprocess", "memory"):
        subprocess.run([sys.executable, __file__, "--mode", mode, "--calls", str(args.calls)], cwd=ROOT, check=True)
    return 0


def _measure(mode: str, calls: int) -> None:
    if mode == "multiprocess":
        from aptix_cli.metrics_dir import prepare_directory

        directory = prepare_directory()
    from shared.errors import LlmError
    from shared.task_names import StepName
    from workers.metrics import MessageTally, WorkerMetrics
    from workers.retry import Reason

    metrics = WorkerMetrics()
    step = MessageTally(steps=[(StepName.REASONER, 0.002)])
    error = LlmError("server error", status_code=503, retryable=True)
    cases = [
        ("a message of one step (1 event)", 1, lambda: metrics.count_message(step)),
        ("a retry (1 event)", 1, lambda: metrics.count_retry(Reason.INFRASTRUCTURE, StepName.REASONER)),
        (
            "a model call with tokens (3 events)",
            3,
            lambda: metrics.count_model_call("gpt", seconds=0.8, input_tokens=900, output_tokens=120),
        ),
        ("a failed model call (1 event)", 1, lambda: metrics.count_model_call("gpt", seconds=0.8, error=error)),
    ]
    print(f"{mode}:")
    for name, events, call in cases:
        for _ in range(min(calls, 10_000)):  # warm up
            call()
        started = time.process_time()
        for _ in range(calls):
            call()
        per_call = (time.process_time() - started) / calls * 1e6
        print(f"  {name:40s} {per_call:6.2f} µs per call, {per_call / events:5.2f} µs per event")
    if mode == "multiprocess":
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
