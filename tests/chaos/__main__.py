"""``python -m tests.chaos``: run the fault matrix, print a table per fault, exit 1 if any fault fails."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from shared.task_names import DEFAULT_TASK_BOUNDARIES, TaskBoundaries
from tests.chaos.faults import FAULTS
from tests.chaos.net.faults import NET_FAULTS
from tests.chaos.net.hosts import NetworkUnavailable, require_network
from tests.chaos.report import render_summary
from tests.chaos.runner import RETRY_BUDGET_SECONDS, plans, run_matrix

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the matrix the arguments ask for.

    Returns:
        0 when every fault passes, 1 when any fails, 2 on a usage error, 3 when network faults were asked
        for on a machine that cannot run them (no root, no ``ip netns`` or no ``iptables``).
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    default = list(NET_FAULTS if args.net else FAULTS)
    names = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else default
    try:
        fault_plans = plans(
            names, small=args.small, turns=args.turns, seed=args.seed, task_boundaries=args.task_boundaries
        )
    except KeyError as exc:
        sys.stderr.write(f"{exc.args[0]}\n")
        return 2
    if set(names) & set(NET_FAULTS):
        try:
            require_network()
        except NetworkUnavailable as exc:
            asked = ", ".join(sorted(set(names) & set(NET_FAULTS)))
            sys.stderr.write(f"cannot run the network faults ({asked}): {exc}\n")
            return 3
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="aptix-chaos-"))
    settle = args.settle if args.settle is not None else (60.0 if args.small else 90.0)
    # SIGTERM ends the run like Ctrl-C, so every child process is still ended on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    began = time.monotonic()
    out = sys.stdout
    out.write(f"chaos matrix ({'small' if args.small else 'full'}): {', '.join(names)}; logs in {log_dir}\n\n")
    out.flush()
    reports = run_matrix(fault_plans, log_dir=log_dir, settle_seconds=settle, out=out)
    out.write(render_summary(reports, retry_budget_seconds=RETRY_BUDGET_SECONDS) + "\n")
    out.write(f"\n{len(reports)} faults in {time.monotonic() - began:.0f} s\n")
    failed = [r.name for r in reports if r.problems(retry_budget_seconds=RETRY_BUDGET_SECONDS)]
    out.write(f"FAILED: {', '.join(failed)}\n" if failed else "every fault passed\n")
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos",
        description="Run turns against real Aptix processes while injecting faults, and count how they ended.",
    )
    parser.add_argument("--turns", type=_positive, default=None, metavar="N", help="turns per fault")
    parser.add_argument(
        "--only", default=None, metavar="FAULT[,FAULT]",
        help=f"run only these faults ({', '.join([*FAULTS, *NET_FAULTS])})",
    )  # fmt: skip
    parser.add_argument(
        "--net", action="store_true",
        help=f"run the network faults instead (hosts apart, root only: {', '.join(NET_FAULTS)})",
    )  # fmt: skip
    parser.add_argument("--small", action="store_true", help="the small matrix: fewer turns, shorter faults")
    parser.add_argument(
        "--settle", type=float, default=None, metavar="S",
        help="seconds to wait after a fault for every turn to end (default 90, 60 with --small)",
    )  # fmt: skip
    parser.add_argument(
        "--task-boundaries", choices=[boundaries.value for boundaries in TaskBoundaries],
        default=DEFAULT_TASK_BOUNDARIES.value,
        help=f"APTIX_TASK_BOUNDARIES of the workers (default {DEFAULT_TASK_BOUNDARIES.value})",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choices (which worker dies)")
    parser.add_argument("--log-dir", default=None, help="where process logs go (default: a new temp directory)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    raise SystemExit(main())
