"""The Celery app of the workers: shared config, one registered task per pipeline layer and the
webhook delivery task, the worker signals that build each process's runtime, start its reconciler
copy, open each step task's log context (``shared.logging``) and, when ``APTIX_OTEL_ENABLED``, start
telemetry (``shared.telemetry``), and the bootstep that keeps the process's heartbeat (``workers.liveness``).

``create_celery(settings)`` is the factory. ``celery_app`` exists for ``celery -A
workers.app:celery_app`` and is built on first access, not at import.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Celery, bootsteps, signals
from celery.worker import state as worker_state

from shared.broker import celery_config, send_webhook
from shared.logging import (
    begin_task,
    configure_logging,
    end_task,
    logging_configured,
    remember_task,
    set_process_fields,
)
from shared.redaction import secrets_in
from shared.settings import Settings, get_settings
from shared.step_sender import CeleryBroker
from shared.task_names import TASK_QUEUES
from workers.liveness import Heartbeat, RunningTask, health_dir, heartbeat_path
from workers.runtime import WorkerRuntime

__all__ = ["create_celery"]

logger = logging.getLogger(__name__)


def create_celery(
    settings: Settings, *, reconciler: bool = True, scheduler: bool = True, heartbeat: str | None = None
) -> Celery:
    """The worker app for ``settings``, with every step task registered.

    Args:
        settings: the worker's settings.
        reconciler: whether the worker runs a copy of the reconciler (``aptix worker --no-reconciler``).
        scheduler: whether the worker runs a copy of the admission scheduler (``aptix worker --no-scheduler``).
        heartbeat: the process's name for its heartbeat file in ``APTIX_WORKER_HEALTH_DIR``
            (``aptix worker``); None writes no heartbeat.
    """
    from workers.tasks import register_tasks

    # Not the process's current or default app: every task and send names this app explicitly,
    # so several apps (the gateway's, a test's) can live in one process.
    app = Celery("aptix", set_as_current=False)
    app.conf.update(celery_config(settings))

    def send_attempt(delivery_id: str, attempt: int, countdown: float) -> None:
        send_webhook(app, delivery_id, attempt=attempt, countdown=countdown)

    # A next step's publish is retried on a lost connection (Celery's policy): the task that sends
    # it is not acknowledged until it is sent.
    runtime = WorkerRuntime(
        settings,
        CeleryBroker(app, retry=True, boundaries=settings.task_boundaries),
        reconciler=reconciler,
        scheduler=scheduler,
        send_webhook=send_attempt,
    )
    register_tasks(app, runtime)
    _connect_signals(app, runtime, settings)
    _connect_log_context(settings)
    if scheduler or reconciler:
        app.steps["worker"].add(_background_step(runtime))
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


def _background_step(runtime: WorkerRuntime) -> type:
    """A worker bootstep that runs the admission scheduler and the reconciler in the worker's main process.

    A bootstep, not ``worker_ready``: an embedded worker (``aptix dev``'s ``WorkController``) starts
    its bootsteps but never sends ``worker_ready``: batch turns would wait for the scheduler and
    stalled turns for the reconciler.
    """

    class Background(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
        label = "AdmissionSchedulerAndReconciler"
        requires = ("celery.worker.components:Pool",)  # after a prefork pool has forked its children

        def start(self, worker: Any) -> None:
            runtime.start_scheduler()
            runtime.start_reconciler()

        def stop(self, worker: Any) -> None:
            runtime.stop_scheduler()
            runtime.stop_reconciler()

    return Background


def _running_tasks() -> list[RunningTask]:
    # A copy first: pool threads add to the set as they accept tasks (list() of a set holds the GIL).
    return [
        RunningTask(str(request.name), str(request.id), float(request.time_start))
        for request in list(worker_state.active_requests)
        if request.time_start
    ]


def _connect_signals(app: Celery, runtime: WorkerRuntime, settings: Settings) -> None:
    def on_init(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            set_process_fields(worker=str(sender.hostname))
            if settings.otel_enabled:  # imported only when on: OpenTelemetry costs every process its import
                from shared.telemetry import start_telemetry

                start_telemetry(settings, service_name="aptix-worker")
            runtime.start(str(sender.hostname))

    def on_child(**_kwargs: Any) -> None:
        runtime.restart_in_child()

    def on_ready(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app and settings.log_format == "json":
            _quiet_sigterm(sender.controller)

    def on_shutdown(sender: Any = None, **_kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            runtime.stop_reconciler()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_process_init.connect(on_child, weak=False)
    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)


def _quiet_sigterm(worker: Any) -> None:
    """In JSON, SIGTERM (how orchestrators stop a worker) is logged as a record, not printed.

    Celery's own handler prints "worker: Warm shutdown (MainProcess)" to stdout, a line of text
    among the JSON; this re-installs it without the notice, and ``worker_shutting_down`` logs it.
    Only a command-line worker installs signal handlers (not one started in a thread).
    """
    from celery.apps.worker import Worker, install_worker_term_handler

    if isinstance(worker, Worker):
        install_worker_term_handler(worker, verbose=False)
        signals.worker_shutting_down.connect(_log_shutdown, weak=False, dispatch_uid="aptix-log-shutdown")


def _log_shutdown(sender: Any = None, sig: Any = None, how: Any = None, **_kwargs: Any) -> None:
    logger.info("worker %s: %s shutdown (%s)", sender, how, sig)


def _connect_log_context(settings: Settings) -> None:
    """Give every line a worker logs about a step task that task's turn (``shared.logging``).

    Celery's signals are global: each handler is connected once per process (``dispatch_uid``),
    whatever the number of apps.
    """

    def on_setup_logging(loglevel: Any = None, **_kwargs: Any) -> None:
        # Connected, this replaces Celery's own logging set-up: `celery -A workers.app:celery_app
        # worker` logs like `aptix worker` (which configured logging before Celery started).
        if not logging_configured():
            configure_logging(loglevel or "INFO", secrets=secrets_in(settings), log_format=settings.log_format)

    signals.setup_logging.connect(on_setup_logging, weak=False, dispatch_uid="aptix-setup-logging")
    signals.task_received.connect(_remember_step_task, weak=False, dispatch_uid="aptix-log-received")
    signals.task_prerun.connect(_begin_step_task, weak=False, dispatch_uid="aptix-log-prerun")
    signals.task_postrun.connect(_end_step_task, weak=False, dispatch_uid="aptix-log-postrun")


def _remember_step_task(request: Any = None, **_kwargs: Any) -> None:
    if request is not None and request.name in TASK_QUEUES:
        remember_task(request.id, _envelope_fields(request.args))


def _begin_step_task(task: Any = None, args: Any = None, **_kwargs: Any) -> None:
    if task is not None and task.name in TASK_QUEUES:
        begin_task(**_envelope_fields(args))


def _end_step_task(task: Any = None, **_kwargs: Any) -> None:
    if task is not None and task.name in TASK_QUEUES:
        end_task()


def _envelope_fields(args: Any) -> dict[str, object]:
    """The log fields of a step task's arguments (its envelope, as JSON): no validation, a few dict reads."""
    payload = args[0] if isinstance(args, list | tuple) and args else None
    if not isinstance(payload, dict):
        return {}
    return {"turn_id": payload.get("turn_id"), "step": payload.get("step"), "iteration": payload.get("iteration")}


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
