"""WorkerRuntime: what one worker process builds once, at start: its database engine, its step
context, its step sender, its metrics, its webhook deliverer, and (in the worker's main process) its
copies of the reconciler and of the admission scheduler.

``workers.app`` calls :meth:`WorkerRuntime.start` from Celery's ``worker_init`` signal and again in
each prefork child (``worker_process_init``), and starts the reconciler and the
admission scheduler from a worker bootstep (which an embedded worker, ``aptix dev``'s, starts too).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import httpx
import redis
from sqlalchemy import Engine

from shared.db import session_factory
from shared.db.org_settings import OrgSettingsRepository
from shared.db.turns import TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.db.webhook_secrets import stored_secrets
from shared.redis_clients import is_redis_url, redis_client
from shared.settings import Settings
from shared.state import RedisStateStore, Timers
from shared.state.admission import AdmissionQueue
from shared.state.keys import RECONCILER_LEADER_KEY, SCHEDULER_LEADER_KEY
from shared.state.leader import LeaderLease
from shared.state.legacy import retire_legacy_keys
from shared.step_sender import Broker, Pushes, StepSender, save_pushes
from shared.ttl_cache import Cached
from shared.turn_ending import TurnEnding
from shared.turn_events import RedisTurnEventLog
from shared.webhooks import WebhookConfig, WebhookSender
from shared.webhooks.config import StoredSecrets
from workers import retry
from workers.admission_window import AdmissionWindow
from workers.broker_watch import RedisBrokerWatch
from workers.context import StepContext, build_context, state_client, utc_now, worker_engine
from workers.dispatch_delays import DispatchDelays
from workers.metrics import WorkerMetrics
from workers.reconciler import Reconciler
from workers.scheduler import AdmissionScheduler
from workers.webhooks import WebhookDeliverer, WebhookSweeper
from workers.webhooks.delivery import SendAttempt, http_client

__all__ = [
    "LeaderPorts", "WorkerRuntime", "build_reconciler", "build_scheduler", "build_step_sender", "webhook_outbox",
    "webhook_sender",
]  # fmt: skip

logger = logging.getLogger(__name__)


_NOT_STARTED = "the worker runtime was not started: step tasks run inside a Celery worker"


class WorkerRuntime:
    """The per-process state of a worker."""

    def __init__(
        self,
        settings: Settings,
        broker: Broker,
        *,
        reconciler: bool = True,
        scheduler: bool = True,
        metrics: WorkerMetrics | None = None,
        send_webhook: SendAttempt | None = None,
    ) -> None:
        """Prepare the runtime; nothing is built or connected until :meth:`start`.

        Args:
            settings: the worker's settings.
            broker: where the process's step messages go (``shared.step_sender``).
            reconciler: whether this worker runs a copy of the reconciler.
            scheduler: whether this worker runs a copy of the admission scheduler.
            metrics: the collectors the steps, the driver and the reconciler count on; built at
                :meth:`start` when None.
            send_webhook: publishes one webhook delivery attempt with a countdown; None: this
                process records no webhook event and delivers none.
        """
        self._settings = settings
        self._broker = broker
        self._send_webhook = send_webhook
        self._deliverer: WebhookDeliverer | None = None
        self._http: httpx.Client | None = None
        self._with_reconciler = reconciler
        self._metrics = metrics
        self._hostname: str | None = None
        self._engine: Engine | None = None
        self._redis: redis.Redis | None = None
        self._ctx: StepContext | None = None
        self._steps: StepSender | None = None
        self._delays: DispatchDelays | None = None
        self._stop = threading.Event()
        self._reconciler_thread: threading.Thread | None = None
        self._with_scheduler = scheduler
        self._scheduler_stop = threading.Event()
        self._scheduler_thread: threading.Thread | None = None

    def start(self, hostname: str) -> None:
        """Build the step context and the step sender of this process (worker node ``hostname``).

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
        self._engine = worker_engine(self._settings, hostname=hostname)
        self._redis = state_client(self._settings)
        stored = stored_secrets(session_factory(self._engine))
        self._ctx = build_context(
            self._settings,
            engine=self._engine,
            hostname=hostname,
            metrics=self._metrics,
            client=self._redis,
            outbox=webhook_outbox(self._settings, self._send_webhook, stored),
            webhook_sender=webhook_sender(self._settings, self._send_webhook, stored),
        )
        pushes = save_pushes(self._broker, self._settings)
        self._steps = build_step_sender(self._broker, self._ctx.timers, self._settings, pushes=pushes)
        self._ctx = replace(self._ctx, push=self._steps.push)
        if self._settings.admission_target_delay_ms > 0:
            report = functools.partial(AdmissionQueue(self._redis).report_delay, f"{hostname}:{os.getpid()}")
            self._delays = DispatchDelays(report)
        if self._send_webhook is not None:
            if self._http is not None:
                self._http.close()
            self._http = http_client()
            self._deliverer = WebhookDeliverer(
                deliveries=WebhookDeliveryRepository(session_factory(self._engine)),
                config=WebhookConfig.from_settings(self._settings, stored=stored),
                http=self._http,
                send=self._send_webhook,
                park_after=self._steps.park_after,
                clock=utc_now,
                random=random.random,
            )

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
        return _started(self._ctx)

    @property
    def steps(self) -> StepSender:
        """The step sender :meth:`start` built: every step message this process sends goes through it.

        Raises: as :attr:`context`.
        """
        return _started(self._steps)

    @property
    def delays(self) -> DispatchDelays | None:
        """Where this process's step tasks note how long their message waited (None: no admission window)."""
        return self._delays

    @property
    def webhooks(self) -> WebhookDeliverer:
        """The webhook deliverer :meth:`start` built.

        Raises:
            RuntimeError: when the worker did not start, or was built without a way to send webhooks.
        """
        return _started(self._deliverer, "the worker runtime was not started with a webhook sender")

    def start_reconciler(self) -> None:
        """Start this worker's copy of the reconciler in a daemon thread (unless turned off)."""
        if not self._with_reconciler or self._reconciler_thread is not None:
            return
        ctx = self.context
        reconciler = build_reconciler(
            self._settings, self._leader_ports(), webhooks=self._sweeper(), webhook_sender=ctx.webhook_sender
        )
        self._reconciler_thread = _daemon(reconciler.run, self._stop, "aptix-reconciler")
        logger.info("reconciler started in worker %s", ctx.hostname)

    def start_scheduler(self) -> None:
        """Start this worker's copy of the admission scheduler in a daemon thread (unless turned off)."""
        if not self._with_scheduler or self._scheduler_thread is not None:
            return
        assert self._engine is not None  # built with the context
        scheduler = build_scheduler(
            self._settings, self._leader_ports(), org_settings=OrgSettingsRepository(session_factory(self._engine))
        )
        self._scheduler_thread = _daemon(scheduler.run, self._scheduler_stop, "aptix-scheduler")
        logger.info("admission scheduler started in worker %s", self.context.hostname)

    def _leader_ports(self) -> LeaderPorts:
        """What this worker's reconciler and scheduler are built from: its ports and its owner name."""
        ctx = self.context
        assert self._redis is not None  # built with the context
        return LeaderPorts(client=self._redis, turns=ctx.turns, steps=self.steps,
                           owner=f"{ctx.hostname}:{os.getpid()}", metrics=ctx.metrics)  # fmt: skip

    def stop_scheduler(self) -> None:
        """Stop this worker's admission scheduler thread."""
        self._scheduler_stop.set()
        thread, self._scheduler_thread = self._scheduler_thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _sweeper(self) -> WebhookSweeper | None:
        if self._send_webhook is None or self._engine is None:
            return None
        return WebhookSweeper(WebhookDeliveryRepository(session_factory(self._engine)), self._send_webhook)

    def stop_reconciler(self) -> None:
        """Stop this worker's reconciler thread."""
        self._stop.set()
        thread, self._reconciler_thread = self._reconciler_thread, None
        if thread is not None:
            thread.join(timeout=5)


def build_step_sender(
    broker: Broker, timers: Timers, settings: Settings, *, pushes: Pushes | None = None
) -> StepSender:
    """The step sender of a worker, a reconciler or a scheduler process: it sends to ``broker`` and
    parks in ``timers`` the waits the retry policy says to park (:func:`workers.retry.park_after`);
    a worker's also builds the messages its driver's save pushes (``pushes``: :func:`save_pushes`)."""
    return StepSender(broker, timers=timers, park_after=retry.park_after(settings), pushes=pushes)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderPorts:
    """What a loop run by one leader at a time (the reconciler, the admission scheduler) is built from: a
    process's ports and the name it holds the loop's leader lease under."""

    client: redis.Redis
    """The state store's Redis: the loop's leader lease and the books it reads."""
    turns: TurnRepository
    """The turns in the database."""
    steps: StepSender
    """What sends the steps the loop sends again (or first)."""
    owner: str
    """The name the loop's leader lease is held under (unique per process)."""
    metrics: WorkerMetrics | None = None
    """Where the loop counts (None: the reconciler counts on a registry of its own; the scheduler does not)."""


def build_reconciler(
    settings: Settings,
    ports: LeaderPorts,
    *,
    webhooks: WebhookSweeper | None = None,
    webhook_sender: WebhookSender | None = None,
) -> Reconciler:
    """A reconciler on a process's ``ports``: given ``webhooks`` it sends the webhook deliveries that are
    due, and given ``webhook_sender`` it sends the webhook event of a turn it gives up on at once. Retires
    the Redis keys of earlier releases first (``shared.state.legacy``; a Redis that does not answer now is
    left for the next start)."""
    client, turns, owner = ports.client, ports.turns, ports.owner
    with contextlib.suppress(redis.RedisError):
        retire_legacy_keys(client)
    broker_url = settings.effective_broker_url
    broker = (
        RedisBrokerWatch(
            redis_client(broker_url, sentinel_password=settings.sentinel_password, socket_timeout=10),
            client,
            owner=owner,
            boundaries=settings.task_boundaries,
        )
        if is_redis_url(broker_url)
        else None
    )
    store = RedisStateStore(client, max_events=settings.events_max_per_turn)
    metrics = ports.metrics or WorkerMetrics()
    admission = AdmissionQueue(client)
    ending = TurnEnding(
        turns=turns,
        cancel_flags=store,
        in_flight=store,
        metrics=metrics,
        clock=utc_now,
        events=RedisTurnEventLog(
            client, ttl_seconds=settings.state_ttl_seconds, max_events=settings.events_max_per_turn
        ),
        admission=admission,
        webhook_sender=webhook_sender,
    )
    return Reconciler(
        settings=settings,
        turns=turns,
        states=store,
        in_flight=store,
        steps=ports.steps,
        leader=LeaderLease(client, key=RECONCILER_LEADER_KEY, owner=owner),
        ending=ending,
        broker=broker,
        metrics=metrics,
        webhooks=webhooks,
        admission=admission,
    )


def build_scheduler(
    settings: Settings, ports: LeaderPorts, *, org_settings: OrgSettingsRepository | None = None
) -> AdmissionScheduler:
    """An admission scheduler on a process's ``ports``; given ``org_settings``, the organisations' own
    admission caps apply (read every few seconds)."""
    return AdmissionScheduler(
        settings=settings,
        admission=AdmissionQueue(ports.client),
        turns=ports.turns,
        steps=ports.steps,
        leader=LeaderLease(ports.client, key=SCHEDULER_LEADER_KEY, owner=ports.owner),
        metrics=ports.metrics,
        caps=None if org_settings is None else org_caps(org_settings),
        window=admission_window(settings),
    )


def admission_window(settings: Settings) -> AdmissionWindow | None:
    """The admission window ``APTIX_ADMISSION_TARGET_DELAY_MS`` asks for (None when it is 0)."""
    if settings.admission_target_delay_ms <= 0:
        return None
    return AdmissionWindow(target_seconds=settings.admission_target_delay_ms / 1000)


def org_caps(org_settings: OrgSettingsRepository) -> Callable[[], dict[str, int]]:
    """The organisations' own admission caps (``aptix orgs set --max-in-flight``), read at most every
    ``shared.ttl_cache.REFRESH_SECONDS`` (the last ones known while the database does not answer)."""
    limits = Cached(org_settings.all, what="the organisations' admission caps (org_settings)")

    def caps() -> dict[str, int]:
        return {org: own.max_in_flight for org, own in limits.get().items() if own.max_in_flight is not None}

    return caps


def webhook_outbox(
    settings: Settings, send_webhook: SendAttempt | None, stored: StoredSecrets | None = None
) -> WebhookOutbox | None:
    """The outbox that records turns' webhook events in their commits; None when no organisation can have a
    webhook secret (none in ``APTIX_WEBHOOK_SECRETS``, and none ``stored``) or the process cannot send them
    (:func:`webhook_sender`)."""
    config = WebhookConfig.from_settings(settings, stored=stored)
    if send_webhook is None or not config.enabled:
        return None
    return WebhookOutbox(config)


def webhook_sender(
    settings: Settings, send_webhook: SendAttempt | None, stored: StoredSecrets | None = None
) -> WebhookSender | None:
    """What sends the first attempt of the deliveries the outbox recorded (:func:`webhook_outbox`), once
    committed; None when the process records none."""
    if send_webhook is None or not WebhookConfig.from_settings(settings, stored=stored).enabled:
        return None
    send = send_webhook

    def first_attempt(delivery_id: str) -> None:
        send(delivery_id, 1, 0.0)

    return WebhookSender(first_attempt)


_Part = TypeVar("_Part")


def _started(part: _Part | None, not_started: str = _NOT_STARTED) -> _Part:
    """``part`` of the runtime, built by :meth:`WorkerRuntime.start`; RuntimeError ``not_started`` when it was not."""
    if part is None:
        raise RuntimeError(not_started)
    return part


def _daemon(run: Callable[[threading.Event], None], stop: threading.Event, name: str) -> threading.Thread:
    """Start ``run(stop)`` in a daemon thread called ``name``, with ``stop`` cleared first."""
    stop.clear()
    thread = threading.Thread(target=run, args=(stop,), name=name, daemon=True)
    thread.start()
    return thread
