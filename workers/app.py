"""The Celery app of the workers: shared config plus one registered task per pipeline step.

``create_celery(settings)`` is the factory. ``celery_app`` exists for ``celery -A
workers.app:celery_app`` and is built on first access, not at import.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from shared.broker import celery_config
from shared.settings import Settings, get_settings

__all__ = ["create_celery"]


def create_celery(settings: Settings) -> Celery:
    """The worker app for ``settings``, with every step task registered."""
    from workers.tasks import register_tasks

    app = Celery("aptix", set_as_current=True)
    # Tasks run by an in-process WorkController (aptix dev) resolve ``self.app`` through the
    # default app; make that this one so retries and sends use this app's broker.
    app.set_default()
    app.conf.update(celery_config(settings))
    register_tasks(app, settings)
    return app


_APP: Celery | None = None


def __getattr__(name: str) -> Any:
    """Build ``celery_app`` lazily, so importing this module starts nothing."""
    global _APP
    if name == "celery_app":
        if _APP is None:
            _APP = create_celery(get_settings())
        return _APP
    raise AttributeError(name)
