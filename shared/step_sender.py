"""StepSender: the one way a turn's next steps leave a process.

Every step message goes out through :meth:`StepSender.send`: the gateway's first steps and
re-entries (``api_gateway.services.turn_sender``), the driver's next step after each task
(``workers.tasks``), the admission scheduler's released turns (``workers.scheduler``) and the
reconciler's re-drives and due parked messages (``workers.reconciler``). A send is one of:

- **now**: each envelope becomes Celery's task message for its step's task, published to the
  step's queue at the envelope's priority. Several envelopes go out through one pooled producer in
  one broker round trip (kombu's ``Producer.batch``: on Redis, one pipeline of ``LPUSH``\\es).
- **after a countdown** (a retry-after): the same message with an ETA, held by a worker until due.
- **parked**: a countdown longer than ``park_after`` is kept in the state store's
  :class:`~shared.state.Timers` instead, and :meth:`StepSender.release_due` (every reconciler
  thread, about once a second) sends it when due. The threshold is the retry policy's
  (``workers.retry.park_after``: half the broker's visibility timeout, beyond which Redis would
  deliver an unacknowledged ETA message a second time); the workers, the reconciler and the
  scheduler build their sender with it. A parked message lost with Redis is recovered like any lost
  message: the turn's in-flight marker lapses and the reconciler re-drives it.

:class:`CeleryBroker` builds each message itself, with Celery's own message factory
(``app.amqp.create_task_message``), and publishes it straight to the queue: ``send_task`` adds
option merging, routing and registry look-ups that cost about two thirds of a publish's CPU, on
every hop of every turn. The message is the one ``app.send_task(name, args=[envelope],
queue=..., countdown=..., priority=...)`` would send, byte for byte (headers, properties, body),
from a worker's task too (its root and parent ids): ``tests/integration/test_broker_transport.py``
holds the two equal against a real ``send_task`` on real Redis, so this is the only path. Celery's
publish signals are sent as ``send_task`` sends them, so with telemetry on (``shared.telemetry``) the
OpenTelemetry instrumentation writes each message's trace context into its headers; each message
goes out in its turn's trace.

**Beside the state.** When the broker is the state store's Redis server (the default:
``APTIX_BROKER_URL`` unset, or another database of the same server whose scripts can ``SELECT`` it:
:func:`scripts_reach`), a worker's next step does not
take a round trip of its own: :meth:`StepSender.push` builds the message as a publish would (kombu
routes it through a producer batch whose Redis command is taken, not sent:
``shared.broker_transport.capturing``) and the driver's save of the turn's state pushes it in its
own script (``shared.state.BrokerPush``), so the message goes if and only if the state was written.
Not with publish signals connected (telemetry writes each message's trace context as it is sent),
nor for a parked message, nor on a Sentinel-managed or another broker: those are sent as above.

**When it was sent.** One header beyond ``send_task``'s, :data:`SENT_AT_HEADER`: the Unix time the
message was built to go (plus its countdown). The worker that runs it notes how long it waited
(``workers.dispatch_delays``), which sizes the admission window.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Protocol

import redis
from celery import Celery, signals
from kombu.exceptions import BatchPublishError
from kombu.exceptions import OperationalError as BrokerError
from kombu.utils.uuid import uuid
from redis import RedisError

from shared.broker_transport import Channel, capturing
from shared.models.envelope import TurnEnvelope
from shared.redis_clients import SERVER_SCHEMES, redis_client
from shared.settings import Settings
from shared.state import BrokerPush, Timers
from shared.task_names import DEFAULT_TASK_BOUNDARIES, TaskBoundaries, step_queue, task_name
from shared.telemetry import turn_spans

__all__ = [
    "SEND_ERRORS", "SENT_AT_HEADER", "BesideState", "Broker", "CeleryBroker", "Pushes", "StepSender", "beside_state",
    "save_pushes", "scripts_reach",
]  # fmt: skip

logger = logging.getLogger(__name__)

SENT_AT_HEADER = "aptix_sent_at"
"""The message header holding when a step message was sent, or due (Unix time): the task sees it as
``request.aptix_sent_at``."""

SEND_ERRORS: tuple[type[Exception], ...] = (BrokerError, BatchPublishError, RedisError, OSError)
"""What a send raises when the broker (or, for a parked message, the state store) refuses."""


class Broker(Protocol):
    """Where step messages go: puts each envelope's message on its step's queue."""

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        """Put each envelope's message on its step's queue, due in ``countdown`` seconds (0: now), in one round trip.

        Raises:
            Exception: one of :data:`SEND_ERRORS` when the broker refuses.
        """


Pushes = Callable[[TurnEnvelope | None, float], BrokerPush | None]
"""Builds a step's message (envelope, countdown) for a save to push (with no envelope, a push of no message,
that only acknowledges); None when it must be sent apart."""


class StepSender:
    """Sends turns' next steps now, after a countdown, or parked until due; one per process."""

    def __init__(
        self,
        broker: Broker,
        *,
        timers: Timers,
        park_after: float,
        clock: Callable[[], float] = time.time,
        pushes: Pushes | None = None,
    ) -> None:
        """Build the sender.

        Args:
            broker: where messages go.
            timers: where long waits are parked (the state store's timers).
            park_after: countdowns longer than this many seconds are parked: the retry policy's
                ``workers.retry.park_after(settings)``; ``math.inf`` for a process that only sends
                now (the gateway).
            clock: the wall clock (Unix time), for a parked message's due time.
            pushes: builds a step's message for the state store's save to push (:meth:`push`); None
                when the broker is not beside the state store.
        """
        self._broker = broker
        self._pushes = pushes
        self._timers = timers
        self._park_after = park_after
        self._clock = clock

    @property
    def park_after(self) -> float:
        """Countdowns longer than this many seconds are parked rather than given to the broker."""
        return self._park_after

    def send(self, envelopes: Sequence[TurnEnvelope], *, countdown: float = 0.0) -> None:
        """Send each envelope's step after ``countdown`` seconds (0: now), all in one broker round trip.

        Args:
            envelopes: the steps to send.
            countdown: seconds before they are due; beyond :attr:`park_after` they are parked.

        Raises:
            Exception: one of :data:`SEND_ERRORS` when the broker (or the state store) refuses.
        """
        if not envelopes:
            return
        if countdown > self._park_after:
            due = self._clock() + countdown
            for envelope in envelopes:
                self._timers.park(envelope.model_dump_json(), due=due)
            return
        self._broker.publish(envelopes, countdown=countdown)

    def push(self, envelope: TurnEnvelope | None, countdown: float = 0.0, ack: str | None = None) -> BrokerPush | None:
        """The message of sending ``envelope`` after ``countdown`` seconds, built but not sent, for the
        state store's save to push in its round trip, and to acknowledge there the message of delivery tag
        ``ack`` (the one the step ran from); None when it must go through :meth:`send` (the broker is not
        beside the state store, publish signals are connected, or it would be parked; or kombu could not
        reach the broker to build it: one of :data:`SEND_ERRORS`, which :meth:`send` then meets in turn).
        With no ``envelope`` (the save that ends a turn's chain) the push sends nothing and only
        acknowledges ``ack``; None when there is nothing to acknowledge or the save cannot."""
        if self._pushes is None or countdown > self._park_after or (envelope is None and ack is None):
            return None
        try:
            push = self._pushes(envelope, countdown)
        except SEND_ERRORS as exc:
            # kombu could not get its producer a connection (the broker restarting): the save then
            # fails or not on its own, and what follows it sends the message apart, as before this fold.
            what = "an acknowledgement" if envelope is None else f"{envelope.step_key}'s message"
            logger.info("could not build %s for the save (%s); it is sent apart", what, exc)
            return None
        return push if push is None or ack is None else replace(push, ack=ack)

    def release_due(self, *, now: float) -> int:
        """Send the parked messages that are due (``now``: Unix time), in one round trip; how many.

        Raises:
            Exception: one of :data:`SEND_ERRORS`; the messages are parked again, due at once.
        """
        due: list[tuple[str, TurnEnvelope]] = []
        for raw in self._timers.pop_due(now=now):
            try:
                due.append((raw, TurnEnvelope.model_validate_json(raw)))
            except ValueError:
                logger.error("dropping a parked message that is not an envelope: %.200s", raw)
        if not due:
            return 0
        try:
            self._broker.publish([envelope for _raw, envelope in due], countdown=0.0)
        except Exception:
            for raw, _envelope in due:  # for the next round; the broker is down
                self._timers.park(raw, due=now)
            raise
        logger.info("sent %d parked message(s) that were due", len(due))
        return len(due)


class CeleryBroker:
    """The broker of a Celery app: each envelope as the task message ``send_task`` would send."""

    def __init__(self, app: Celery, *, retry: bool, boundaries: TaskBoundaries = DEFAULT_TASK_BOUNDARIES) -> None:
        """Build it on ``app`` (the gateway's producer-only app or a worker's).

        Args:
            app: the Celery app whose producer pool, configuration and message factory are used.
            retry: whether a message published alone is retried on a lost connection, under the
                app's ``task_publish_retry_policy`` (as ``send_task`` does): a worker's next step
                (the task is not acknowledged until it is sent). The gateway answers 503 at once
                instead. Messages published together are not: a pipeline succeeds or fails whole.
            boundaries: where the workers end a task (``APTIX_TASK_BOUNDARIES``): it decides a round entry's
                queue (``shared.task_names.step_queue``).
        """
        self._app = app
        self._retry = retry
        self._boundaries = boundaries

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        """Put each envelope's message on its queue, due in ``countdown`` seconds, through one pooled producer.

        Raises:
            kombu.exceptions.OperationalError: the broker refused (a connection error, translated as
                ``send_task`` translates it); ``BatchPublishError`` when a pipeline's outcome is unknown.
        """
        if not envelopes:
            return
        # Read once per call, not per message: what send_task reads on every call.
        conf = self._conf
        ids = self._ids()
        signalled = bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)
        with self._app.producer_or_acquire() as producer, producer.connection._reraise_as_library_errors():
            if len(envelopes) == 1:
                self._publish(producer, envelopes[0], countdown, conf, ids, signalled, retry=self._retry)
                return
            with producer.batch(max_size=len(envelopes)):
                for envelope in envelopes:
                    self._publish(producer, envelope, countdown, conf, ids, signalled, retry=False)

    def push(self, envelope: TurnEnvelope | None, countdown: float, *, db: int | None) -> BrokerPush | None:
        """The message :meth:`publish` would send for ``envelope``, as the ``LPUSH`` kombu would send it,
        for a save to push on a broker beside the state store (``db``: the broker's database when it is
        not the state store's); None when publish signals are connected or the broker's channel is not a
        Redis channel of ``shared.broker_transport`` without a ``global_keyprefix`` (nothing is sent either
        way). Its acknowledgement keys are the channel's (``BrokerPush.ack`` sets the tag). With no
        ``envelope``, a push of no message: the acknowledgement keys alone (publish signals do not matter)."""
        if envelope is not None and (signals.before_task_publish.receivers or signals.after_task_publish.receivers):
            return None
        with self._app.producer_or_acquire() as producer, producer.connection._reraise_as_library_errors():
            channel = producer.channel
            if type(channel) is not Channel or channel.global_keyprefix:
                return None  # another broker; or kombu's client prefixes every key, which a script would not
            unacked = {"unacked_key": channel.unacked_key, "unacked_index_key": channel.unacked_index_key}
            if envelope is None:
                return BrokerPush(key=None, payload="", db=db, **unacked)
            with capturing() as taken, producer.batch(max_size=1):
                self._publish(producer, envelope, countdown, self._conf, self._ids(), False, retry=False)
        commands = [command for batch in taken for command in batch.commands]
        if len(commands) != 1 or commands[0][0] != "lpush":
            return None  # kombu would send more than the message (a queue with an expiry): send it apart
        key, payload = commands[0][1]
        return BrokerPush(key=str(key), payload=payload, db=db, **unacked)

    def _ids(self) -> tuple[str | None, str | None]:
        """The root and parent task ids of messages sent from the task running now (None outside one)."""
        parent = self._app.current_worker_task  # the task these are sent from, in a worker
        return (parent.request.root_id or parent.request.id, parent.request.id) if parent else (None, None)

    def _publish(
        self,
        producer: Any,
        envelope: TurnEnvelope,
        countdown: float,
        conf: _PublishConf,
        ids: tuple[str | None, str | None],
        signalled: bool,
        *,
        retry: bool,
    ) -> None:
        # What Celery.send_task and AMQP.send_task_message do for a step, in the same order, without
        # what they do for options a step never has (see the module docstring).
        name = task_name(envelope.step)
        queue = step_queue(envelope.step, self._boundaries).value
        args = [envelope.model_dump(mode="json")]
        # What Flower shows as the task's arguments. Celery computes it with its pure-Python
        # saferepr (3 % of a worker's CPU); an envelope is a small flat dict, so repr() is the same
        # text (the identity test holds them equal).
        shown = repr(args)
        root_id, parent_id = ids
        headers, properties, body, _sent_event = conf.create_task_message(
            uuid(), name, args, {}, countdown or None, None, None, None, None, 0, None, None, None,
            self._app.thread_oid, None, None, False, root_id, parent_id, None, None,
            ignore_result=None, argsrepr=shown, kwargsrepr="{}",
        )  # fmt: skip
        properties["priority"] = envelope.priority  # send_task copies its options into the properties
        headers[SENT_AT_HEADER] = time.time() + (countdown or 0.0)
        declare: list[Any] = []  # the queue is direct: a message goes straight to its list
        with turn_spans(envelope.turn_id):
            if signalled:  # telemetry's instrumentation writes the trace context into the headers
                signals.before_task_publish.send(
                    sender=name, body=body, exchange="", routing_key=queue, declare=declare, headers=headers,
                    properties=properties, retry_policy=conf.retry_policy,
                )  # fmt: skip
            producer.publish(
                body, exchange="", routing_key=queue, serializer=conf.serializer, compression=conf.compression,
                retry=retry, retry_policy=conf.retry_policy, delivery_mode=conf.delivery_mode, declare=declare,
                headers=headers, timeout=None, confirm_timeout=None, **properties,
            )  # fmt: skip
            if signalled:
                signals.after_task_publish.send(sender=name, body=body, headers=headers, exchange="", routing_key=queue)

    @cached_property
    def _conf(self) -> _PublishConf:
        conf = self._app.conf
        return _PublishConf(
            create_task_message=self._app.amqp.create_task_message,
            serializer=conf.task_serializer,
            compression=conf.task_compression,
            delivery_mode=conf.task_default_delivery_mode,
            retry_policy=dict(conf.task_publish_retry_policy),
        )


@dataclass(frozen=True, slots=True)
class _PublishConf:
    """What ``send_task`` reads of its app on every call, read once."""

    create_task_message: Callable[..., tuple[dict[str, Any], dict[str, Any], Any, Any]]
    """Celery's message factory (``app.amqp``'s, for the app's task protocol)."""
    serializer: str
    compression: str | None
    delivery_mode: str | int
    retry_policy: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BesideState:
    """A broker on the state store's Redis server."""

    db: int | None
    """The broker's database, when it is not the state store's; None: the same."""


def beside_state(state_url: str, broker_url: str) -> BesideState | None:
    """Whether the broker at ``broker_url`` is the state store's Redis server at ``state_url``: both plain
    Redis servers (``redis://``, ``rediss://``, ``unix://``: not a Sentinel-managed primary, not a
    cluster), with the same address and credentials; None when it is not."""
    from redis.connection import parse_url

    schemes = {url.partition("://")[0].lower() for url in (state_url, broker_url)}
    if not schemes <= set(SERVER_SCHEMES):
        return None
    state, broker = parse_url(state_url), parse_url(broker_url)  # type: ignore[no-untyped-call]  # redis-py
    state_db, broker_db = int(state.pop("db", 0) or 0), int(broker.pop("db", 0) or 0)
    if state != broker:
        return None
    return BesideState(db=None if broker_db == state_db else broker_db)


_SELECT_PROBE = "redis.call('select', ARGV[1]) redis.call('set', KEYS[1], '1', 'EX', 60) return 1"


def scripts_reach(state_url: str, broker_url: str, db: int) -> bool:
    """Whether a script run on the state store's server reaches the broker's database ``db`` by ``SELECT``,
    as Redis's scripts do (a database a script selects is its own, since Redis 2.8.12). Only a server that
    says it is Redis (``INFO server``) is asked, then one probe key is written by a script and read back
    (deleted after): fakeredis (``aptix dev``'s embedded server) has no ``INFO`` and does not keep a
    script's ``SELECT`` apart from its caller's, and a proxy may refuse ``SELECT``. False for any of
    these, or an unreachable server: the steps are then sent apart."""
    key = f"aptix:select-probe:{uuid()}"
    state = redis_client(state_url, socket_timeout=5, socket_connect_timeout=5)
    broker = redis_client(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        if "redis_version" not in state.info("server"):
            return False
        state.eval(_SELECT_PROBE, 1, key, db)
        reached = broker.get(key) is not None
        broker.delete(key)
        state.delete(key)
        return reached
    except redis.RedisError:
        return False
    finally:
        state.close()
        broker.close()


def save_pushes(broker: Broker, settings: Settings) -> Pushes | None:
    """What builds a step's message for a write of the state store to push (:meth:`StepSender.push`): a worker's
    save, the gateway's markers of the turns it sends. For a Celery broker on the state store's Redis server (in
    another database, only when a script reaches it: one probe, :func:`scripts_reach`); None otherwise."""
    if not isinstance(broker, CeleryBroker):
        return None
    beside = beside_state(settings.redis_url, settings.effective_broker_url)
    if beside is None:
        return None
    if beside.db is not None and not scripts_reach(settings.redis_url, settings.effective_broker_url, beside.db):
        logger.info("the state store's scripts cannot reach the broker's database: each step is sent apart")
        return None
    return functools.partial(broker.push, db=beside.db)
