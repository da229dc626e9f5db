"""One thin task per pipeline layer: validate the envelope, run its step(s), send what comes next;
and the webhook task: one attempt at one delivery.

A step task returns the steps its message ran, each with its time, and the step it sent next
(:func:`ran`): Celery's ``task-succeeded`` event carries it, so Flower's Result column shows every step,
those a task runs inline (``APTIX_TASK_BOUNDARIES``) included.

Everything else is the driver's (:func:`workers.driver.run_step`), including every retry. A message
the task cannot hand on (the broker refused the next message) is requeued, never dropped: its step
is recorded, so running it again only sends that next message. With the broker on the state store's
Redis server, the driver's save has sent the next message already (``Dispatch.sent``) and acknowledged
this one on Redis (``Dispatch.acked``: Celery's ack of it then stays in memory); the save that ends the
turn's chain acknowledges its message so too (``MessageTally.acked``).

A task whose step failed its turn ends by raising :class:`~shared.errors.TurnFailed`, after the
driver recorded the failure and after the next message (persist) was sent: Celery marks the task
FAILURE, so Flower shows it red and its Failed filter finds the turn. The exception is declared
expected (``throws``: one INFO line, no traceback, in the worker's log; the driver has already
logged the failure at WARNING) and the message is acknowledged (``acks_on_failure``), never retried
or redelivered. What the turn records does not change.

A webhook attempt that meets a database or Redis error is dropped: its delivery stays pending in the
database and the sweep sends it.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import redis
from celery import Celery, Task
from celery.backends.base import BaseBackend
from celery.exceptions import Reject
from kombu.exceptions import OperationalError as BrokerError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from sqlalchemy.exc import SQLAlchemyError

from shared.broker_transport import acknowledged_by_save
from shared.errors import TurnFailed
from shared.models.envelope import TurnEnvelope
from shared.step_sender import SEND_ERRORS, SENT_AT_HEADER
from shared.task_names import LAYER_OF, WEBHOOK_TASK, Layer
from workers.driver import Dispatch, run_step
from workers.metrics import MessageTally
from workers.runtime import WorkerRuntime

__all__ = ["ran", "register_tasks"]

logger = logging.getLogger(__name__)

_DELIVERY_ERRORS = (SQLAlchemyError, redis.RedisError, BrokerError)


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    """Register the task of every layer, and the webhook task, on ``app``; they run on ``runtime``.

    On ``app`` only (``shared=False``): Celery's default adds a task to every app finalized after it in
    the process, before that app's own, so a second worker app (the tests', ``aptix dev``'s) would run
    its steps on the first app's runtime.

    Each task keeps the app's result backend (disabled: no task stores a result) for good: Celery keeps
    ``app.backend`` per thread, and to it each greenlet of a gevent pool is a thread, so every task run
    there would build a backend of its own (a tenth of a millisecond of configuration lookups each)."""
    backend = app.backend
    for layer in Layer:
        _register(app, layer, runtime, backend)
    _register_webhook(app, runtime, backend)


class _AttemptMessage(BaseModel):
    """The webhook task's argument."""

    model_config = ConfigDict(extra="forbid")

    delivery_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    attempt: Annotated[int, Field(ge=1)]


def _register_webhook(app: Celery, runtime: WorkerRuntime, backend: BaseBackend) -> None:
    @app.task(  # type: ignore[untyped-decorator]  # Celery's decorator is untyped
        name=WEBHOOK_TASK, acks_late=True, ignore_result=True, shared=False, backend=backend
    )
    def deliver_webhook(payload: dict[str, Any]) -> None:
        try:
            message = _AttemptMessage.model_validate(payload)
        except ValidationError as exc:
            logger.error("dropping a malformed webhook message: %s", exc.errors(include_input=False))
            return
        try:
            runtime.webhooks.deliver(message.delivery_id, message.attempt)
        except _DELIVERY_ERRORS as exc:
            logger.warning("webhook delivery %s, attempt %d: %s; the sweep sends it again",
                           message.delivery_id, message.attempt, type(exc).__name__)  # fmt: skip


def _register(app: Celery, layer: Layer, runtime: WorkerRuntime, backend: BaseBackend) -> None:
    @app.task(  # type: ignore[untyped-decorator]  # Celery's decorator is untyped
        name=f"aptix.step.{layer.value}",
        bind=True,
        acks_late=True,
        acks_on_failure=True,  # a step that failed its turn is acknowledged, never run again
        throws=(TurnFailed,),
        ignore_result=True,
        shared=False,
        backend=backend,
    )
    def step_task(self: Task, payload: dict[str, Any]) -> str | None:
        envelope = _validate(layer, payload)
        if envelope is None:
            return None
        if runtime.delays is not None:
            runtime.delays.observe(self.request.get(SENT_AT_HEADER))
        tag = (self.request.properties or {}).get("delivery_tag")
        tally = MessageTally()
        queue = (self.request.delivery_info or {}).get("routing_key")  # the queue it came on
        dispatch = run_step(runtime.context, envelope, delivery_tag=tag, tally=tally, queue=queue)
        if dispatch is None:
            if tally.acked and tag is not None:  # by the save that ended the chain
                acknowledged_by_save(tag)
            return ran(tally, None)
        if dispatch.acked and tag is not None:  # by the save that sent the next step: Celery's ack then skips Redis
            acknowledged_by_save(tag)
        if not dispatch.sent:  # else the driver's save put it on its queue
            try:
                runtime.steps.send([dispatch.envelope], countdown=dispatch.countdown)
            except SEND_ERRORS as exc:
                logger.warning(
                    "could not send %s of turn %s (%s); requeueing", dispatch.envelope.step_key, envelope.turn_id, exc
                )
                raise Reject(exc, requeue=True) from exc
        if dispatch.failed is not None:
            raise TurnFailed(dispatch.failed.code.value, dispatch.failed.message)
        return ran(tally, dispatch)


def ran(tally: MessageTally, dispatch: Dispatch | None) -> str | None:
    """What a step task returns: the steps its message ran, each with its time, and the step it sent next
    (None when it ran none: a redelivery of a step that had run, a message dropped). Celery puts it in the
    task's ``task-succeeded`` event, so Flower's Result column shows every step a task ran, inline ones
    included (``APTIX_TASK_BOUNDARIES``); the result is not stored (``ignore_result``)."""
    if not tally.steps:
        return None
    steps = ", ".join(f"{step.value} {seconds * 1000:.1f} ms" for step, seconds in tally.steps)
    if dispatch is None:
        return f"ran {steps}"
    later = f" in {dispatch.countdown:.1f} s" if dispatch.countdown else ""
    return f"ran {steps}; next {dispatch.envelope.step.value}{later}"


def _validate(layer: Layer, payload: dict[str, Any]) -> TurnEnvelope | None:
    try:
        envelope = TurnEnvelope.model_validate(payload)
    except ValidationError as exc:
        logger.error("dropping a malformed %s message: %s", layer.value, exc.errors(include_input=False))
        return None
    if LAYER_OF[envelope.step] is not layer:
        logger.error("dropping a %s envelope delivered to the %s task", envelope.step.value, layer.value)
        return None
    return envelope
