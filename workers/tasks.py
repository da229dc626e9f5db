"""One thin task per pipeline step, all through :func:`workers.driver.run_step`.

A task validates its JSON envelope, runs the step and sends the next task by name. Transient
connection errors are retried by Celery; a step that failed is never retried here (the driver
already committed the failure).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, Task
from pydantic import ValidationError

from shared.broker import send_step
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.task_names import StepName, task_name
from workers.context import StepContext, build_context
from workers.driver import TRANSIENT_ERRORS, StepBusy, TurnNotRecorded, fail_turn, run_step

__all__ = ["register_tasks"]

logger = logging.getLogger(__name__)

_UNRECORDED_RETRIES = 40
_contexts: dict[str, StepContext] = {}
_contexts_lock = threading.Lock()


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register the task of every step on ``app``; its steps run with ``settings``."""
    for step in StepName:
        _register(app, step, settings)


def _register(app: Celery, step: StepName, settings: Settings) -> None:
    @app.task(  # type: ignore[untyped-decorator]  # Celery's decorator is untyped
        name=task_name(step),
        bind=True,
        acks_late=True,
        autoretry_for=TRANSIENT_ERRORS,
        retry_backoff=True,
        retry_backoff_max=30,
        max_retries=20,
        ignore_result=True,
    )
    def step_task(self: Task, payload: dict[str, Any]) -> None:
        try:
            envelope = TurnEnvelope.model_validate(payload)
        except ValidationError as exc:
            logger.error("dropping a malformed %s message: %s", step.value, exc.errors(include_input=False))
            return
        if envelope.step is not step:
            logger.error("dropping a %s envelope delivered to %s", envelope.step.value, step.value)
            return
        ctx = _context(settings, self.request.hostname or "worker")
        try:
            dispatch = run_step(ctx, envelope)
        except StepBusy as busy:
            raise self.retry(countdown=busy.retry_in, max_retries=None) from busy
        except TurnNotRecorded as missing:
            # Usually the gateway's commit is a few milliseconds behind its message. After ~20 s
            # the turn was never recorded (the gateway failed before committing): drop the message.
            if self.request.retries >= _UNRECORDED_RETRIES:
                logger.warning("turn %s was never recorded; dropping its message", envelope.turn_id)
                return
            raise self.retry(countdown=0.5, max_retries=None) from missing
        except TRANSIENT_ERRORS:
            raise
        except Exception:  # outside any step (loading, saving): fail the turn rather than strand it
            logger.exception("turn %s could not run %s", envelope.turn_id, envelope.step_key)
            fail_turn(ctx, envelope.turn_id, "the pipeline could not run this turn")
            return
        if dispatch is not None:
            send_step(self.app, dispatch.envelope, countdown=dispatch.countdown)


def _context(settings: Settings, hostname: str) -> StepContext:
    with _contexts_lock:
        ctx = _contexts.get(hostname)
        if ctx is None:
            ctx = build_context(settings, hostname=hostname)
            _contexts[hostname] = ctx
        return ctx
