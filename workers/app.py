"""The Celery app of the workers: shared config, one registered task per pipeline step, the
worker signals that build each process's runtime and start its reconciler copy, and the bootstep
that keeps the process's heartbeat (``workers.liveness``).

``create_celery(settings)`` is the factory. ``celery_app`` exists for ``celery -A
workers.app:celery_app`` and is built on first access, not at import.
"""

from __future__ import annotations

import functools
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state as worker_state

from shared.broker import celery_config, send_step
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings, get_settings
from workers.liveness import Heartbeat, RunningTask, health_dir, heartbeat_path
from workers.runtime import WorkerRuntime

__all__ = ["create_celery"]


def create_celery(settings: Settings, *, reconciler: bool = True, heartbeat: str | None = None) -> Celery:
    """The worker app for ``settings``, with every step task registered.

    Args:
        settings: the worker's settings.
        reconciler: whether the worker runs a copy of the reconciler (``aptix worker --no-reconciler``).
        heartbeat: the process's name for its heartbeat file in ``APTIX_WORKER_HEALTH_DIR``
            (``aptix worker``); None writes no heartbeat.
    """
    from workers.tasks import register_tasks

    # Not the process's current or default app: every task and send names this app explicitly,
    # so several apps (the gateway's, a test's) can live in one process.
    app = Celery("aptix", set_as_current=False)
    app.conf.update(celery_config(settings))

    def send(envelope: TurnEnvelope, countdown: float) -> None:
        send_step(app, envelope, countdown=countdown)

    runtime = WorkerRuntime(settings, send, reconciler=reconciler)
    register_tasks(app, runtime)
    _connect_signals(app, runtime)
    if heartbeat is not None:
        app.steps["worker"].add(_liveness_step(settings, runtime, heartbeat))
    return app


def _liveness_step(settings: Settings, runtime: WorkerRuntime, name: str) -> type:
    """A worker bootstep that keeps the heartbeat of process ``name`` (``workers.liveness``)."""

    class Liveness(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
        # The worker's timer runs inside its event loop (or, under gevent, as greenlets of its hub),
        # so a timer entry runs only while the loop does. Steps start before the consumer (last).
        requires = ("celery.worker.components:Timer",)
        label = "Liveness"

        def __init__(self, parent: Any, **kwargs: Any) -> None:
            super().__init__(parent, **kwargs)
            self.heartbeat: Heartbeat | None = None
            self.entry: Any = None

        def start(self, worker: Any) -> None:
            executor = runtime.context.executor
            self.heartbeat = Heartbeat(
                heartbeat_path(health_dir(settings), name),
                name=name,
                hostname=str(worker.hostname),
                settings=settings,
                running=_running_tasks,
                connected=lambda: getattr(getattr(worker, "consumer", None), "connection", None) is not None,
                tools=lambda: (executor.overrunning, executor.max_threads),
                loop_runs_tasks=worker.pool_cls.__module__.endswith(".solo"),
            )
            self.heartbeat.start()
            self.entry = worker.timer.call_repeatedly(self.heartbeat.interval, self.heartbeat.tick)

        def stop(self, worker: Any) -> None:
            if self.heartbeat is not None:
                self.heartbeat.stop()

    return Liveness


def _running_tasks() -> list[RunningTask]:
    # A copy first: pool threads add to the set as they accept tasks (list() of a set holds the GIL).
    return [
        RunningTask(str(request.name), str(request.id), float(request.time_start))
        for request in list(worker_state.active_requests)
        if request.time_start
    ]


def _connect_signals(app: Celery, runtime: WorkerRuntime) -> None:
    def on_init(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            runtime.start(str(sender.hostname))

    def on_child(**_kwargs: Any) -> None:
        runtime.restart_in_child()

    def on_ready(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            runtime.start_reconciler()

    def on_shutdown(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            runtime.stop_reconciler()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_process_init.connect(on_child, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)


def __getattr__(name: str) -> Any:
    """``celery_app``, the app ``celery -A workers.app:celery_app`` runs, built on first access.

    Importing this module builds nothing: Celery's ``-A`` takes an attribute, not a factory, so the
    attribute is computed here (PEP 562) from :func:`get_settings` the first time it is read.
    """
    if name == "celery_app":
        return _celery_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _celery_app() -> Celery:
    return create_celery(get_settings())
