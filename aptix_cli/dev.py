"""The embedded dev stack: everything in one process, no external services.

A SQLite file for the durable store, an embedded Redis (broker and state store), Celery worker
threads in this process, the gateway, and the scripted model unless ``APTIX_LLM_BASE_URL`` is set.
Any ``APTIX_*`` URL that is set wins over the embedded default, so the same command can use real
services. The pipeline is the production one: same Celery app, same tasks, same stores.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

from aptix_cli.embedded_redis import EmbeddedRedis
from aptix_cli.launcher import free_port
from scripted_llm import ScriptedServer

__all__ = ["DevStack", "DevStackInfo", "dev_api_key", "key_file"]

logger = logging.getLogger(__name__)

DEFAULT_SQLITE_PATH = "aptix-dev.sqlite"


@dataclass(frozen=True)
class DevStackInfo:
    """What a user of the running stack needs to know."""

    url: str
    api_key: str
    database_url: str
    redis_url: str
    broker_url: str
    llm_base_url: str
    embedded: tuple[str, ...]
    """Which parts run embedded (database, redis, broker, llm)."""


class DevStack:
    """Starts the embedded stack; ``with DevStack() as info: ...`` or ``start()`` / ``stop()``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        worker_threads: int = 8,
        sqlite_path: str = DEFAULT_SQLITE_PATH,
        llm_latency_ms: float = 0.0,
        api_key: str | None = None,
    ) -> None:
        """Prepare the stack; nothing starts before :meth:`start`.

        Args:
            host: Where the gateway listens.
            port: Its port (0: a free one).
            worker_threads: Threads of the in-process Celery worker.
            sqlite_path: The SQLite file of the durable store (unless ``APTIX_DATABASE_URL`` is set).
            llm_latency_ms: Latency of the embedded scripted model.
            api_key: The API key to accept (for the org ``dev-org``, user ``dev-user``); None: the key
                kept beside the SQLite file from an earlier start, else a new one written there.
                ``APTIX_API_KEYS``, when set, wins over both.
        """
        self._host = host
        self._port = port
        self._worker_threads = worker_threads
        self._sqlite_path = sqlite_path
        self._llm_latency_ms = llm_latency_ms
        self._api_key = api_key
        self._exits = ExitStack()
        self._worker: Any = None
        self._gateway: uvicorn.Server | None = None
        self.info: DevStackInfo | None = None

    def start(self) -> DevStackInfo:
        """Start every part; returns once the gateway answers."""
        from shared.db.migrate import upgrade
        from shared.settings import Settings

        embedded: list[str] = []
        database_url = os.environ.get("APTIX_DATABASE_URL") or _embedded(embedded, "database", self._sqlite_url())
        redis_url = os.environ.get("APTIX_REDIS_URL")
        broker_url = os.environ.get("APTIX_BROKER_URL")
        if not redis_url or not broker_url:
            server = self._exits.enter_context(EmbeddedRedis())
            redis_url = redis_url or _embedded(embedded, "redis", server.url(0))
            broker_url = broker_url or (
                os.environ.get("APTIX_REDIS_URL") or _embedded(embedded, "broker", server.url(1))
            )
        llm_base_url = os.environ.get("APTIX_LLM_BASE_URL")
        if not llm_base_url:
            llm = self._exits.enter_context(ScriptedServer(latency_ms=self._llm_latency_ms, journal_size=1000))
            llm_base_url = _embedded(embedded, "llm", llm.base_url)
        api_keys = os.environ.get("APTIX_API_KEYS")
        if not api_keys:
            api_keys = f"{dev_api_key(self._sqlite_path, self._api_key)}:dev-org:dev-user"
        settings = Settings(
            database_url=database_url,
            redis_url=redis_url,
            broker_url=broker_url,
            llm_base_url=llm_base_url,
            api_keys=api_keys,
        )
        upgrade(settings.database_url)
        self._start_worker(settings)
        port = self._port or free_port(self._host)
        self._start_gateway(settings, port)
        self.info = DevStackInfo(
            url=f"http://{self._host}:{port}",
            api_key=api_keys.split(",")[0].split(":")[0],
            database_url=database_url,
            redis_url=redis_url,
            broker_url=broker_url,
            llm_base_url=llm_base_url,
            embedded=tuple(embedded),
        )
        return self.info

    def wait(self) -> None:
        """Block until the gateway stops (Ctrl-C)."""
        while self._gateway is not None and not self._gateway.should_exit:
            time.sleep(0.2)

    def stop(self, *, timeout: float = 20.0) -> None:
        """Stop the gateway, the worker threads and the embedded services, waiting ``timeout`` at most.

        A worker thread stuck in a blocking call must not keep ``aptix dev`` from ending on Ctrl-C;
        what has not stopped by then is left to the process exit.
        """
        stopper = threading.Thread(target=self._stop_all, name="aptix-dev-stop", daemon=True)
        stopper.start()
        stopper.join(timeout)
        if stopper.is_alive():
            logger.warning("the dev stack did not stop within %.0fs; leaving it to the process exit", timeout)

    def _stop_all(self) -> None:
        if self._gateway is not None:
            self._gateway.should_exit = True
        if self._worker is not None:
            self._worker.stop(in_sighandler=False)
            self._worker = None
        self._exits.close()

    def __enter__(self) -> DevStackInfo:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _sqlite_url(self) -> str:
        return f"sqlite:///{os.path.abspath(self._sqlite_path)}"

    def _start_worker(self, settings: Any) -> None:
        from shared.task_names import Queue
        from workers.app import create_celery

        app = create_celery(settings)
        # As `celery worker` does: the pool's threads run tasks through the default app, and the step
        # tasks are registered on this app alone (workers.tasks.register_tasks).
        app.set_default()
        started = threading.Event()

        class _Worker(app.WorkController):  # type: ignore[name-defined,misc]  # app-bound class
            def on_consumer_ready(self, consumer: Any) -> None:
                super().on_consumer_ready(consumer)
                started.set()

        worker = _Worker(
            app=app,
            pool_cls="threads",
            concurrency=self._worker_threads,
            queues=[queue.value for queue in Queue],
            hostname=f"dev@{socket.gethostname()}",
            send_events=True,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel="WARNING",
        )
        threading.Thread(target=worker.start, name="aptix-dev-worker", daemon=True).start()
        if not started.wait(30):
            raise RuntimeError("the in-process worker did not start within 30s")
        self._worker = worker

    def _start_gateway(self, settings: Any, port: int) -> None:
        from api_gateway.app import create_app
        from api_gateway.server import server_config

        self._gateway = uvicorn.Server(server_config(create_app(settings), settings, host=self._host, port=port))
        threading.Thread(target=self._gateway.run, name="aptix-dev-gateway", daemon=True).start()
        deadline = time.monotonic() + 30
        while not self._gateway.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self._host}:{port}")
            time.sleep(0.05)


def dev_api_key(sqlite_path: str, chosen: str | None = None) -> str:
    """The dev API key: ``chosen``, else the key kept beside the SQLite file, else a new one kept there.

    Keeping it makes the key stable across restarts, so an exported ``APTIX_KEY`` stays valid.
    The file is readable by its owner only.
    """
    if chosen:
        return chosen
    path = key_file(sqlite_path)
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    key = f"dev-{secrets.token_urlsafe(12)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(key + "\n")
    return key


def key_file(sqlite_path: str) -> Path:
    """Where ``aptix dev`` keeps its generated API key: beside the SQLite file (``aptix-dev.key``)."""
    return Path(sqlite_path).with_suffix(".key")


def _embedded(parts: list[str], name: str, url: str) -> str:
    parts.append(name)
    return url
