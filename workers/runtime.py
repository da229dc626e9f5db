"""WorkerRuntime: what one worker process builds once, at start: its database engine, its step
context, its dispatcher, its metrics, and (in the worker's main process) its copy of the reconciler.

``workers.app`` calls :meth:`WorkerRuntime.start` from Celery's ``worker_init`` signal and again in
each prefork child (``worker_process_init``), and starts the reconciler on ``worker_ready``.
"""

from __future__ import annotations

import logging
import os
import threading

import redis
from sqlalchemy import Engine

from shared.db.turns import TurnRepository
from shared.settings import Settings
from shared.state import StateStore
from shared.turn_events import RedisTurnEventLog
from workers.context import StepContext, build_context, worker_engine
from workers.dispatcher import Dispatcher, SendStep
from workers.metrics import WorkerMetrics
from workers.reconciler import Reconciler

__all__ = ["WorkerRuntime", "build_reconciler"]

logger = logging.getLogger(__name__)


class WorkerRuntime:
    """The per-process state of a worker."""

    def __init__(
        self, settings: Settings, send: SendStep, *, reconciler: bool = True, metrics: WorkerMetrics | None = None
    ) -> None:
        """Prepare the runtime; nothing is built or connected until :meth:`start`.

        Args:
            settings: the worker's settings.
            send: publishes one step message with a countdown.
            reconciler: whether this worker runs a copy of the reconciler.
            metrics: the collectors the steps, the driver and the reconciler count on; built at
                :meth:`start` when None.
        """
        self._settings = settings
        self._send = send
        self._with_reconciler = reconciler
        self._metrics = metrics
        self._hostname: str | None = None
        self._engine: Engine | None = None
        self._ctx: StepContext | None = None
        self._dispatcher: Dispatcher | None = None
        self._stop = threading.Event()
        self._reconciler_thread: threading.Thread | None = None

    def start(self, hostname: str) -> None:
        """Build the step context and the dispatcher of this process (worker node ``hostname``).

        Celery calls it (through ``worker_init``) before the worker takes any message, on the
        thread that builds the worker, so no task can see a half-built runtime.
        """
        if self._engine is not None:
            # A prefork child inherited its parent's engine: leave the parent's database
            # connections alone (closing them here would close them for the parent too).
            self._engine.dispose(close=False)
        self._hostname = hostname
        # Built once: a prefork child keeps its parent's collectors (prometheus_client moves their
        # values to the child's own files when it sees the new pid).
        self._metrics = self._metrics or WorkerMetrics()
        self._engine = worker_engine(self._settings)
        self._ctx = build_context(self._settings, engine=self._engine, hostname=hostname, metrics=self._metrics)
        self._dispatcher = Dispatcher.for_settings(self._send, self._ctx.store, self._settings)

    def restart_in_child(self) -> None:
        """Rebuild the context in a prefork child (connections must not cross a fork)."""
        if self._hostname is not None:
            self.start(self._hostname)

    @property
    def context(self) -> StepContext:
        """The step context :meth:`start` built.

        Raises:
            RuntimeError: when the worker did not start (a task called outside a worker).
        """
        if self._ctx is None:
            raise RuntimeError("the worker runtime was not started: step tasks run inside a Celery worker")
        return self._ctx

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher :meth:`start` built.

        Raises:
            RuntimeError: when the worker did not start (a task called outside a worker).
        """
        if self._dispatcher is None:
            raise RuntimeError("the worker runtime was not started: step tasks run inside a Celery worker")
        return self._dispatcher

    def start_reconciler(self) -> None:
        """Start this worker's copy of the reconciler in a daemon thread (unless turned off)."""
        if not self._with_reconciler or self._reconciler_thread is not None:
            return
        ctx = self.context
        reconciler = build_reconciler(
            self._settings,
            turns=ctx.turns,
            store=ctx.store,
            dispatcher=self.dispatcher,
            owner=f"{ctx.hostname}:{os.getpid()}",
            metrics=ctx.metrics,
        )
        self._stop.clear()
        self._reconciler_thread = threading.Thread(
            target=reconciler.run, args=(self._stop,), name="aptix-reconciler", daemon=True
        )
        self._reconciler_thread.start()
        logger.info("reconciler started in worker %s", ctx.hostname)

    def stop_reconciler(self) -> None:
        """Stop this worker's reconciler thread."""
        self._stop.set()
        thread, self._reconciler_thread = self._reconciler_thread, None
        if thread is not None:
            thread.join(timeout=5)


def build_reconciler(
    settings: Settings,
    *,
    turns: TurnRepository,
    store: StateStore,
    dispatcher: Dispatcher,
    owner: str,
    metrics: WorkerMetrics | None = None,
) -> Reconciler:
    """A reconciler on a process's ports (``store`` must be the Redis state store); it counts on ``metrics``."""
    broker_url = settings.effective_broker_url
    broker = (
        redis.Redis.from_url(broker_url, socket_timeout=10)
        if broker_url.startswith(("redis://", "rediss://"))
        else None
    )
    client = getattr(store, "client", None)
    if not isinstance(client, redis.Redis):
        raise TypeError("the reconciler needs the Redis state store")
    return Reconciler(
        settings=settings,
        turns=turns,
        store=store,
        client=client,
        dispatcher=dispatcher,
        owner=owner,
        broker_client=broker,
        metrics=metrics,
        events=RedisTurnEventLog(
            client, ttl_seconds=settings.state_ttl_seconds, max_events=settings.events_max_per_turn
        ),
    )
