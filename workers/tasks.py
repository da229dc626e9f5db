"""One thin task per pipeline step: validate the envelope, run the step, send what comes next.

Everything else is the driver's (:func:`workers.driver.run_step`), including every retry. A message
the task cannot hand on (the broker refused the next message) is requeued, never dropped: its step
is recorded, so running it again only sends that next message.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Reject
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError

from shared.models.envelope import TurnEnvelope
from shared.task_names import StepName, task_name
from workers.driver import run_step
from workers.runtime import WorkerRuntime

__all__ = ["register_tasks"]

logger = logging.getLogger(__name__)

_SEND_ERRORS = (BrokerError, redis.RedisError, OSError)


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    """Register the task of every step on ``app``; they run on ``runtime``'s context."""
    for step in StepName:
        _register(app, step, runtime)


def _register(app: Celery, step: StepName, runtime: WorkerRuntime) -> None:
    @app.task(  # type: ignore[untyped-decorator]  # Celery's decorator is untyped
        name=task_name(step), bind=True, acks_late=True, ignore_result=True
    )
    def step_task(self: Task, payload: dict[str, Any]) -> None:
        envelope = _validate(step, payload)
        if envelope is None:
            return
        dispatch = run_step(runtime.context, envelope)
        if dispatch is None:
            return
        try:
            runtime.dispatcher.dispatch(dispatch.envelope, dispatch.countdown, now=time.time())
        except _SEND_ERRORS as exc:
            logger.warning("could not send %s of turn %s (%s); requeueing", dispatch.envelope.step_key, envelope.turn_id, exc)
            raise Reject(exc, requeue=True) from exc


def _validate(step: StepName, payload: dict[str, Any]) -> TurnEnvelope | None:
    try:
        envelope = TurnEnvelope.model_validate(payload)
    except ValidationError as exc:
        logger.error("dropping a malformed %s message: %s", step.value, exc.errors(include_input=False))
        return None
    if envelope.step is not step:
        logger.error("dropping a %s envelope delivered to %s", envelope.step.value, step.value)
        return None
    return envelope
