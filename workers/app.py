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
    app.conf.update(celery_config(settings))
    app.conf.aptix_settings = settings
    register_tasks(app)
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
