"""LocalStack: the integration tests' gateway and worker processes, started as plain processes.

Everything ``docker compose up`` starts can also be started this way; each process is stopped by
its own PID (see :class:`aptix_cli.launcher.ProcessGroup`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from aptix_cli.launcher import ManagedProcess, ProcessGroup, free_port, wait_until

__all__ = ["LocalStack"]


class LocalStack(ProcessGroup):
    """Starts and stops Aptix processes sharing one environment: ``aptix gateway`` and ``aptix worker``."""

    def __init__(self, env: dict[str, str], *, log_dir: Path | None = None) -> None:
        super().__init__(env, log_dir=log_dir)
        self.metrics_urls: dict[str, str] = {}
        """Each worker's metrics URL (``APTIX_WORKER_METRICS_PORT``), by name."""

    def start_worker(
        self,
        name: str,
        *,
        queues: str = "pipeline,llm,tools",
        pool: str | None = "threads",
        concurrency: int | None = 4,
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> ManagedProcess:
        """Start ``aptix worker`` as node ``name@<host>`` and wait until it is ready.

        With ``pool=None`` it gets no ``--pool`` (nor ``--concurrency``): one Celery worker per queue
        group, each on its own pool (``aptix_cli.worker_group``), named ``<group>.name@<host>``; it
        is ready when all of them are. It serves its metrics on a free port of its own
        (:attr:`metrics_urls`). ``env`` overrides the stack's environment for this worker; ``args`` are
        more options of ``aptix worker`` (e.g. ``--no-scheduler``).

        Raises:
            RuntimeError: it exited or was not ready in time (with its log).
        """
        from aptix_cli.worker_group import plan

        argv = [sys.executable, "-m", "aptix_cli", "worker", "--queues", queues, "--hostname", f"{name}@%h", *args]
        if pool is not None:
            argv += ["--pool", pool, "--concurrency", str(concurrency or 1)]
        processes = 1 if pool is not None else len(plan(queues))
        port = free_port()
        self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        process = self.start(name, argv, {"APTIX_WORKER_METRICS_PORT": str(port), **(env or {})})
        wait_until([process], lambda: process.log().count("ready.") >= processes, timeout)
        return process

    def start_reconciler(self, name: str = "reconciler", *, timeout: float = 30.0) -> ManagedProcess:
        """Start ``aptix reconciler`` (serving no metrics) and wait until it is ready.

        Raises:
            RuntimeError: it exited or was not ready in time (with its log).
        """
        return self._start_ready(name, "reconciler", timeout)

    def start_scheduler(self, name: str = "scheduler", *, timeout: float = 30.0) -> ManagedProcess:
        """Start ``aptix scheduler`` (serving no metrics) and wait until it is ready.

        Raises:
            RuntimeError: it exited or was not ready in time (with its log).
        """
        return self._start_ready(name, "scheduler", timeout)

    def _start_ready(self, name: str, command: str, timeout: float) -> ManagedProcess:
        """Start ``aptix COMMAND`` with no metrics port (the default one may be another process's), until "ready."."""
        process = self.start(name, [sys.executable, "-m", "aptix_cli", command], {"APTIX_WORKER_METRICS_PORT": "0"})
        wait_until([process], lambda: "ready." in process.log(), timeout)
        return process
