"""The processes of a bench run: scripted model, gateway, ``aptix worker`` processes and bare-chain workers.

They are started on one :class:`~aptix_cli.launcher.ProcessGroup` (one environment, one log
folder, each stopped by its own pid). ``aptix worker`` is started exactly as an operator would: with no
flags unless ``--worker-args`` gives some; :func:`worker_plan` reads those flags the way ``aptix
worker`` does, so the bare-chain workers get the same Celery workers (queues, pool, concurrency).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from celery import Celery

from aptix_cli.launcher import ManagedProcess, ProcessGroup, answers, free_port, wait_until
from aptix_cli.worker_group import DEFAULT_QUEUES, WorkerSpec, plan

__all__ = ["BenchProcesses", "WorkerPlan", "worker_plan"]

_START_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What each ``aptix worker`` of the run is given, and the Celery workers that makes it start."""

    args: tuple[str, ...]
    """The extra flags (``--worker-args``), possibly none."""
    specs: tuple[WorkerSpec, ...]
    """The Celery worker processes one ``aptix worker`` starts (``aptix_cli.worker_group.plan``)."""
    loglevel: str

    def describe(self) -> str:
        """E.g. ``pipeline on prefork x2; tools on threads x8; llm on gevent x2000``."""
        return "; ".join(f"{spec.queues} on {spec.pool} x{spec.concurrency}" for spec in self.specs)


def worker_plan(args: Sequence[str]) -> WorkerPlan:
    """Read ``aptix worker`` flags (others are passed on but do not change the plan).

    Raises:
        ValueError: the flags name an unknown queue or an impossible pool plan.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--queues", default=DEFAULT_QUEUES)  # as aptix worker: the bench names the same groups
    parser.add_argument("--pool", default=None)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--loglevel", default="INFO")
    known, _ = parser.parse_known_args(list(args))
    specs = plan(known.queues, known.pool, known.concurrency, known.processes)
    return WorkerPlan(args=tuple(args), specs=tuple(specs), loglevel=known.loglevel)


class BenchProcesses:
    """Starts and stops the run's processes; every one started is stopped by :meth:`stop_all`.

    Args:
        env: the ``APTIX_*`` settings every process gets (on top of this process's environment).
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.group = ProcessGroup(env)

    @property
    def log_dir(self) -> str:
        """The folder of the processes' logs."""
        return str(self.group.log_dir)

    def start_model(self, *, port: int, latency_ms: float) -> ManagedProcess:
        """``python -m scripted_llm`` on ``port``; returns once it answers."""
        argv = [
            sys.executable, "-m", "scripted_llm", "--host", "127.0.0.1", "--port", str(port),
            "--latency-ms", f"{latency_ms:g}", "--journal-size", "1",
        ]  # fmt: skip
        process = self.group.start("model", argv)
        wait_until([process], lambda: answers(f"http://127.0.0.1:{port}/__scripted/healthz"), _START_SECONDS)
        return process

    def start_gateway(self) -> tuple[ManagedProcess, str]:
        """``aptix gateway`` on a free port; returns the process and its base URL once ``/healthz`` answers."""
        return self.group.start_gateway(port=free_port(), timeout=_START_SECONDS)

    def start_workers(self, count: int, worker: WorkerPlan, control: Celery) -> list[ManagedProcess]:
        """``count`` ``aptix worker`` processes; returns once all their Celery workers answer a ping.

        Args:
            count: processes to start.
            worker: their flags and the Celery workers each starts.
            control: a Celery app on the same broker, to ping the workers with.
        """
        processes = []
        for index in range(count):
            argv = [sys.executable, "-m", "aptix_cli", "worker", *worker.args]
            if len(worker.specs) == 1 and "--hostname" not in worker.args:
                argv += ["--hostname", f"bench{index}@%h"]  # one Celery worker: its default node name is shared
            # Each serves its metrics, as in production, on a port of its own.
            metrics = {"APTIX_WORKER_METRICS_PORT": str(free_port())}
            processes.append(self.group.start(f"worker-{index}", argv, metrics))
        _wait_for_nodes(control, processes, count * len(worker.specs))
        return processes

    def start_bare_workers(self, count: int, worker: WorkerPlan, control: Celery) -> list[ManagedProcess]:
        """For each of ``count`` would-be ``aptix worker`` processes, one bare-chain Celery worker per spec.

        Returns:
            The Celery worker processes, once all answer a ping.
        """
        processes = []
        for index in range(count):
            for spec in worker.specs:
                argv = [
                    sys.executable, "-m", "celery", "-A", "aptix_cli.bench.bare_chain:app", "worker",
                    "-Q", spec.queues, "-P", spec.pool, "-c", str(spec.concurrency),
                    "-n", f"bare{index}-{spec.group}@%h", "--without-gossip", "--loglevel", _bare_loglevel(worker),
                ]  # fmt: skip
                processes.append(self.group.start(f"bare-{index}-{spec.group}", argv))
        _wait_for_nodes(control, processes, len(processes))
        return processes

    def stop(self, processes: Sequence[ManagedProcess]) -> None:
        """Stop some of the processes (SIGTERM, then SIGKILL), each by its pid."""
        self.group.stop(processes, timeout=30.0)

    def stop_all(self) -> None:
        """Stop every process still running."""
        self.group.stop_all()


def _bare_loglevel(worker: WorkerPlan) -> str:
    """The bare workers' log level: as quiet per task as ``aptix worker``, which drops Celery's two
    INFO lines per task below DEBUG."""
    return worker.loglevel if worker.loglevel.upper() == "DEBUG" else "WARNING"


def _wait_for_nodes(control: Celery, processes: Sequence[ManagedProcess], expected: int) -> None:
    """Until ``expected`` Celery nodes answer a ping (whatever their log level, so not by their logs)."""

    def ready() -> bool:
        replies = control.control.ping(timeout=1.0) or []
        return len({node for reply in replies for node in reply}) >= expected

    wait_until(processes, ready, _START_SECONDS)
