"""ChaosSystem: one fault's whole system under test, as plain child processes the harness owns.

Its own Redis (one server, or a Sentinel-managed primary and replica; for the cluster fault, a Redis
Cluster for the state store besides) and database
(``tests.chaos.backing``), the scripted model, worker processes, the gateway and, for the reconciler
fault, reconciler processes. Each can be SIGKILLed (its process group) and started again: the model
and the gateway on the same port. :meth:`close` ends every process it ever started and drops the
database.
"""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from aptix_cli.launcher import ManagedProcess, answers, free_port, wait_until
from shared.task_names import DEFAULT_TASK_BOUNDARIES
from tests.chaos.backing import Database, RedisServer, SentinelRedis
from tests.chaos.processes import REPO_ROOT, kill_tree, spawn
from tests.support.redis_cluster import LocalRedisCluster

__all__ = ["API_KEY", "MODEL", "ChaosSystem", "SystemOptions"]

logger = logging.getLogger(__name__)

API_KEY = "chaos-key"
"""The bearer key the gateway accepts (``APTIX_API_KEYS``)."""
MODEL = "scripted-model"
"""The model the system serves (``APTIX_LLM_MODEL``)."""

_READY = re.compile(r"\bready\b", re.IGNORECASE)
_RECONCILER_SETTLE_SECONDS = 3.0
"""A reconciler that printed no "ready" counts as started once it has run this long."""


@dataclass(frozen=True, slots=True)
class SystemOptions:
    """The shape of the system a fault runs against."""

    workers: int = 2
    """Worker processes (queues pipeline,llm,tools; threads pool)."""
    worker_concurrency: int = 8
    reconcilers: int = 0
    """Standalone ``aptix reconciler`` processes; when above 0 the workers run with ``--no-reconciler``."""
    model_latency_ms: float = 100.0
    state_cluster: bool = False
    """Whether the state store runs on a Redis Cluster of its own (three primaries, a replica each;
    ``tests.support.redis_cluster``); the broker stays on the fault's Redis server either way."""
    sentinel: bool = False
    """Redis as a Sentinel-managed primary with one replica and three sentinels (state and broker on it,
    named by ``sentinel://`` URLs) instead of one server."""
    task_boundaries: str = DEFAULT_TASK_BOUNDARIES.value
    """``APTIX_TASK_BOUNDARIES`` of every process."""


class ChaosSystem:
    """Starts, kills and restarts the processes of one fault's system."""

    def __init__(self, *, fault_dir: Path, catalog: Path, options: SystemOptions) -> None:
        self.dir = fault_dir
        self.options = options
        self.redis: RedisServer | SentinelRedis = (
            SentinelRedis(log_dir=fault_dir) if options.sentinel else RedisServer(log_dir=fault_dir)
        )
        self.cluster = LocalRedisCluster(fault_dir) if options.state_cluster else None
        self.database = Database()
        self.tool_log = fault_dir / "tool-runs.log"
        self.model_url = f"http://127.0.0.1:{free_port()}"
        self.gateway_url = f"http://127.0.0.1:{free_port()}"
        self.workers: list[ManagedProcess] = []
        """Worker processes not killed by the harness (a replacement may still be starting)."""
        self.reconcilers: list[ManagedProcess] = []
        self._catalog = catalog
        self._model: ManagedProcess | None = None
        self._gateway: ManagedProcess | None = None
        self._started: list[ManagedProcess] = []
        self._saved_journal: list[Any] = []
        self._serial = 0
        self._ready: set[str] = set()

    @property
    def state_url(self) -> str:
        """``APTIX_REDIS_URL``: the state store's Redis (database 0 of the fault's server, or its cluster)."""
        return self.cluster.url if self.cluster is not None else self.redis.url(0)

    def env(self) -> dict[str, str]:
        """The environment of every Aptix process (inherited ``APTIX_*`` variables are dropped)."""
        inherited = {key: value for key, value in os.environ.items() if not key.startswith("APTIX_")}
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), inherited.get("PYTHONPATH")]))
        return {
            **inherited,
            "PYTHONPATH": python_path,
            "APTIX_DATABASE_URL": self.database.url,
            "APTIX_REDIS_URL": self.state_url,
            "APTIX_BROKER_URL": self.redis.url(1),
            "APTIX_LLM_BASE_URL": f"{self.model_url}/v1",
            "APTIX_LLM_API_KEY": "chaos",
            "APTIX_LLM_MODEL": MODEL,
            "APTIX_API_KEYS": f"{API_KEY}:chaos-org:chaos-user",
            "APTIX_LLM_LOCAL_ONLY": "1",
            "APTIX_MODES_FILE": str(self._catalog),
            "APTIX_CHAOS_TOOL_LOG": str(self.tool_log),
            "APTIX_STEP_LEASE_SECONDS": "5",
            "APTIX_TASK_BOUNDARIES": self.options.task_boundaries,
            "APTIX_RECONCILER_DEADLINE_SECONDS": "10",
            "APTIX_RECONCILER_INTERVAL_SECONDS": "1",
            "APTIX_LLM_RETRY_BUDGET_SECONDS": "120",
            # Several workers and reconcilers share this host: none serves metrics (each would need a port).
            "APTIX_WORKER_METRICS_PORT": "0",
            # Up to 200 concurrent clients, all from 127.0.0.1: no per-address connection cap.
            "APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT": "0",
        }

    def start(self) -> None:
        """Start everything: Redis, the database, the model, the workers, the gateway, the reconcilers."""
        self.tool_log.touch()
        self.redis.start()
        if self.cluster is not None:
            self.cluster.start()
        self.database.create()
        self.start_model()
        for worker in [self.spawn_worker() for _ in range(self.options.workers)]:
            self.wait_worker(worker)
        self.start_gateway()
        for _ in range(self.options.reconcilers):
            self.start_reconciler()

    def spawn_worker(self) -> ManagedProcess:
        """Start a worker process without waiting for it (see :meth:`wait_worker`)."""
        name = self._name("worker")
        worker = self._spawn(name, self.worker_argv(name))
        self.workers.append(worker)
        return worker

    def worker_argv(self, name: str) -> list[str]:
        """The command of worker ``name``: every queue, a threads pool, its own Celery node name."""
        argv = [
            sys.executable, "-m", "aptix_cli", "worker", "--queues", "pipeline,llm,tools", "--pool", "threads",
            "--concurrency", str(self.options.worker_concurrency), "--hostname", f"{name}@%h",
        ]  # fmt: skip
        if self.options.reconcilers:
            argv.append("--no-reconciler")
        return argv

    def wait_worker(self, worker: ManagedProcess, *, timeout: float = 90.0) -> None:
        """Wait until ``worker`` logged "ready." (raises RuntimeError if it exits first)."""
        wait_until([worker], lambda: self.worker_ready(worker), timeout)

    def worker_ready(self, worker: ManagedProcess) -> bool:
        """Whether ``worker`` logged Celery's "ready." (remembered, so a long log is read once)."""
        if worker.name not in self._ready and "ready." in worker.log():
            self._ready.add(worker.name)
        return worker.name in self._ready

    def kill_worker(self, rng: random.Random) -> ManagedProcess:
        """SIGKILL a random worker that is up and ready; raises LookupError when none is."""
        candidates = [worker for worker in self.workers if worker.alive() and self.worker_ready(worker)]
        if not candidates:
            raise LookupError("no worker is ready to be killed")
        victim = rng.choice(candidates)
        kill_tree(victim)
        self.workers.remove(victim)
        logger.info("killed worker %s (pid %d)", victim.name, victim.pid)
        return victim

    def start_model(self) -> None:
        """Start the scripted model on its port (the same one after a restart)."""
        port = self.model_url.rsplit(":", 1)[1]
        argv = [
            sys.executable, "-m", "scripted_llm", "--port", port,
            "--latency-ms", str(self.options.model_latency_ms), "--journal-size", "200000",
        ]  # fmt: skip
        self._model = self._spawn(self._name("model"), argv)
        wait_until([self._model], lambda: answers(f"{self.model_url}/__scripted/healthz"), 60)

    def kill_model(self) -> None:
        """Save the model's journal, then SIGKILL it at once (the journal lives in its memory)."""
        if self._model is None:
            return
        self._saved_journal.extend(self._fetch_journal())
        self._model.kill()
        self._model = None
        logger.info("killed the scripted model")

    def model_journal(self) -> list[Any]:
        """Every request body the model received, across its restarts."""
        live = self._fetch_journal() if self._model is not None else []
        return [*self._saved_journal, *live]

    def start_gateway(self) -> None:
        """Start the gateway on its port (the same one after a restart) and wait for ``/healthz``."""
        port = self.gateway_url.rsplit(":", 1)[1]
        argv = [sys.executable, "-m", "aptix_cli", "gateway", "--host", "127.0.0.1", "--port", port]
        self._gateway = self._spawn(self._name("gateway"), argv)
        wait_until([self._gateway], lambda: answers(f"{self.gateway_url}/healthz"), 60)

    @property
    def gateway(self) -> ManagedProcess | None:
        """The gateway process running now (None: killed and not started again)."""
        return self._gateway

    def kill_gateway(self) -> None:
        """SIGKILL the gateway."""
        if self._gateway is not None:
            self._gateway.kill()
            self._gateway = None
            logger.info("killed the gateway")

    def start_reconciler(self) -> ManagedProcess:
        """Start an ``aptix reconciler`` process; it counts as started once it said "ready" or ran 3 s."""
        name = self._name("reconciler")
        reconciler = self._spawn(name, [sys.executable, "-m", "aptix_cli", "reconciler"])
        self.reconcilers.append(reconciler)
        wait_until([reconciler], lambda: _reconciler_started(reconciler), 60)
        return reconciler

    def kill_reconciler(self) -> ManagedProcess:
        """SIGKILL the oldest reconciler (the likeliest to be the active one)."""
        victim = self.reconcilers.pop(0)
        victim.kill()
        logger.info("killed reconciler %s (pid %d)", victim.name, victim.pid)
        return victim

    def close(self) -> None:
        """End every process this system started, drop its database and stop its Redis."""
        for process in reversed(self._started):
            try:
                kill_tree(process)
            except (OSError, subprocess.TimeoutExpired):
                logger.exception("could not end %s (pid %d)", process.name, process.pid)
        self._started.clear()
        try:
            self.database.drop()
        except psycopg.Error:
            logger.exception("could not drop database %s", self.database.name)
        finally:
            self.redis.stop()
            if self.cluster is not None:
                self.cluster.stop()

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> ManagedProcess:
        """Start ``argv`` as ``name`` with ``env`` (default :meth:`env`); :meth:`close` ends it."""
        process = spawn(name, argv, env=self.env() if env is None else env, log_dir=self.dir)
        self._started.append(process)
        return process

    def _name(self, kind: str) -> str:
        self._serial += 1
        return f"{kind}{self._serial}"

    def _fetch_journal(self) -> list[Any]:
        response = httpx.get(f"{self.model_url}/__scripted/requests", timeout=120.0)
        response.raise_for_status()
        return [entry["body"] for entry in response.json()["requests"]]


def _reconciler_started(reconciler: ManagedProcess) -> bool:
    # The reconciler command is new: accept its "ready" line if it prints one, else a few seconds alive.
    if _READY.search(reconciler.log()):
        return True
    return time.monotonic() - reconciler.started_at >= _RECONCILER_SETTLE_SECONDS
