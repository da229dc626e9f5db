"""The Celery app of the workers: shared config, one registered task per pipeline layer and the
webhook delivery task, and the worker signals that build each process's runtime and start its reconciler copy.

``create_celery(settings)`` is the factory. ``celery_app`` exists for ``celery -A
workers.app:celery_app`` and is built on first access, not at import.
"""

from __future__ import annotations

import functools
from typing import Any

from celery import Celery, signals

from shared.broker import celery_config, send_step, send_webhook
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings, get_settings
from workers.runtime import WorkerRuntime

__all__ = ["create_celery"]


def create_celery(settings: Settings, *, reconciler: bool = True) -> Celery:
    """The worker app for ``settings``, with every step task registered.

    Args:
        settings: the worker's settings.
        reconciler: whether the worker runs a copy of the reconciler (``aptix worker --no-reconciler``).
    """
    from workers.tasks import register_tasks

    # Not the process's current or default app: every task and send names this app explicitly,
    # so several apps (the gateway's, a test's) can live in one process.
    app = Celery("aptix", set_as_current=False)
    app.conf.update(celery_config(settings))

    def send(envelope: TurnEnvelope, countdown: float) -> None:
        send_step(app, envelope, countdown=countdown)

    def send_attempt(delivery_id: str, attempt: int, countdown: float) -> None:
        send_webhook(app, delivery_id, attempt=attempt, countdown=countdown)

    runtime = WorkerRuntime(settings, send, reconciler=reconciler, send_webhook=send_attempt)
    register_tasks(app, runtime)
    _connect_signals(app, runtime)
    return app


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
