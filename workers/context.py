"""StepContext: everything a step may touch, built once per worker process and passed explicitly."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, Protocol

import redis
from sqlalchemy import Engine

from shared.db import session_factory
from shared.db.engine import ProcessKind, engine_for
from shared.db.sessions import SessionRepository
from shared.db.tool_runs import ToolRunRepository
from shared.db.turns import TurnRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.envelope import TurnEnvelope
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.state import (
    BrokerPush,
    CancelFlags,
    InFlightMarkers,
    RedisStateStore,
    StepLeases,
    Timers,
    TurnStates,
)
from shared.state.admission import AdmissionQueue
from shared.state.redis_store import connect
from shared.turn_ending import AdmissionSlots, TurnEnding
from shared.turn_events import RedisTurnEventLog, TurnEventLog
from shared.webhooks import WebhookSender
from workers.batch_slots import BatchSlots, green
from workers.leases import LeaseRenewer
from workers.llm.breaker import CircuitBreaker, breaker_key
from workers.llm.limiter import BreakerLeave, RateLimiter, Slot, Unlimited, limiter_keys, limits_for
from workers.llm.types import LlmResponse
from workers.metrics import WorkerMetrics
from workers.process_gate import ProcessGate
from workers.tools.executor import ToolExecutor
from workers.tools.registry import ToolRegistry

__all__ = [
    "BreakerPort",
    "LimiterPort",
    "LlmPort",
    "StepContext",
    "breakers_on",
    "build_context",
    "lease_renewer",
    "limiters_on",
    "state_client",
    "utc_now",
    "worker_engine",
]


class LlmPort(Protocol):
    """What steps need from the LLM client: one call, read whole or streamed."""

    def create(self, request: dict[str, Any]) -> LlmResponse:
        """Send one Responses API request."""

    def stream(
        self,
        request: dict[str, Any],
        on_text: Callable[[str], None],
        *,
        on_text_done: Callable[[], None] | None = None,
    ) -> LlmResponse:
        """Send one Responses API request with ``"stream": true``; ``on_text`` gets each text delta as it
        arrives, ``on_text_done`` the end of each text part, and the result is what :meth:`create`
        returns for the same answer."""


class BreakerPort(BreakerLeave, Protocol):
    """A model's circuit breaker, shared by every worker (``workers.llm.breaker``): asked before each call
    (``before_call``, through the limiter's ``pace``), told after."""

    def record_success(self, now: float) -> None:
        """The call succeeded."""

    def record_failure(self, now: float) -> None:
        """The call failed (transport error, timeout, 5xx)."""


class LimiterPort(Protocol):
    """A model's shared rate limits (``workers.llm.limiter``): asked before each call, told after."""

    def pace(self, request: dict[str, Any], breaker: BreakerPort | None = None, *, at: float = 0.0) -> Slot:
        """Let the call go now (and charge it), or say how long to wait: the limits' wait, else the wait of
        ``breaker`` (asked at ``at``, once the limits let the call go; nothing is charged then)."""

    def settle(self, slot: Slot, *, used: int, called: bool = True) -> None:
        """Correct the call's charge: the tokens it used, or nothing at all when it was not made."""

    def pause(self, seconds: float) -> float:
        """Stop every worker's calls to the model for ``seconds`` (a 429's Retry-After)."""


def utc_now() -> datetime:
    """The wall clock, timezone-aware."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class StepContext:
    """The ports of one worker process: built once when the worker starts, passed to every step."""

    settings: Settings
    """The worker's settings; steps read their limits and timeouts here."""
    states: TurnStates
    """The turns' hot state (Redis): each step begins on it (lease, cancel check, load) and saves it."""
    cancel_flags: CancelFlags
    """The turns' cancel flags (ending a turn early sets them)."""
    in_flight: InFlightMarkers
    """The turns' in-flight markers, which the reconciler reads."""
    timers: Timers
    """Messages parked until due (the step sender's long waits: ``shared.step_sender``)."""
    events: TurnEventLog
    """The turns' event logs (Redis Streams), which clients follow live (``GET /v1/turns/{id}/events``)."""
    sessions: SessionRepository
    """Durable sessions."""
    turns: TurnRepository
    """Durable turns: records, checkpoints, commits."""
    tool_runs: ToolRunRepository
    """Durable record of each server tool call's start and outcome."""
    catalog: ModeCatalog
    """The modes and operator tools."""
    tools: ToolRegistry
    """The server tools, by name."""
    executor: ToolExecutor
    """Runs server tools with a timeout, on this process's tool threads."""
    llm: LlmPort
    """The model client."""
    breaker: Callable[[str], BreakerPort]
    """The breaker of a model, by model name."""
    leases: LeaseRenewer
    """Holds, renews and gives back the step leases this process holds."""
    hostname: str
    """The worker node's name (Celery's ``-n``), stamped on trace steps and lease owners."""
    clock: Callable[[], datetime] = utc_now
    """The wall clock; tests fix it."""
    random: Callable[[], float] = field(default=random.random)
    """Jitter for retry delays; tests fix it."""
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    """The process's Prometheus collectors (:mod:`workers.metrics`); a private set when not given (tests)."""
    gate: ProcessGate = field(default_factory=ProcessGate)
    """Lets a step whose last delivery was lost run alone in this process (``workers.process_gate``)."""
    batch_slots: BatchSlots | None = None
    """Bounds the batch turns' tasks a gevent process runs at once, an interactive turn's never waiting
    (``workers.batch_slots``); None: unbounded (a threads pool is bounded by its threads)."""
    limiter: Callable[[str], LimiterPort] = field(default=lambda model: Unlimited())
    """The shared rate limiter of a model, by model name; none limits anything when not given (tests)."""
    admission: AdmissionSlots | None = None
    """The organisations' admission slots, which a turn ended outside ``persist`` leaves (none when not given)."""
    webhook_sender: WebhookSender | None = None
    """Sends the webhook deliveries a commit or an early end recorded (none when not given: the sweep does)."""
    push: Callable[[TurnEnvelope | None, float, str | None], BrokerPush | None] = field(default=lambda *_args: None)
    """The next step's message for the save to push, acknowledging the message of the delivery tag given
    (``StepSender.push``); None: the task sends it. With no envelope (the save that ends the chain), the
    acknowledgement alone; None: the task acknowledges its message as usual."""

    @property
    def state_ttl_seconds(self) -> int:
        """How long Redis keeps a turn's state; past the client-tool timeout the snapshot takes over."""
        return self.settings.state_ttl_seconds

    @property
    def ending(self) -> TurnEnding:
        """Ends a turn outside the pipeline's ``persist`` step, with all its cleanup (``shared.turn_ending``)."""
        return TurnEnding(
            turns=self.turns,
            cancel_flags=self.cancel_flags,
            in_flight=self.in_flight,
            metrics=self.metrics,
            clock=self.clock,
            events=self.events,
            admission=self.admission,
            webhook_sender=self.webhook_sender,
        )

    def deadline(self) -> datetime:
        """The database deadline of a turn that moves now (``APTIX_RECONCILER_DEADLINE_SECONDS`` ahead)."""
        return self.clock() + timedelta(seconds=self.settings.reconciler_deadline_seconds)

    def alive_until(self, wait_seconds: float = 0.0) -> float:
        """The in-flight marker of a turn that moves now and waits ``wait_seconds`` before its next step."""
        return self.clock().timestamp() + wait_seconds + self.settings.reconciler_deadline_seconds


def breakers_on(client: redis.Redis, settings: Settings) -> Callable[[str], BreakerPort]:
    """One shared breaker per model name, on ``client``."""

    @lru_cache(maxsize=64)
    def breaker(model: str) -> BreakerPort:
        return CircuitBreaker(
            client,
            name=breaker_key(settings.llm_base_url, model),
            failure_threshold=settings.llm_breaker_failures,
            open_seconds=settings.llm_breaker_open_seconds,
        )

    return breaker


def limiters_on(client: redis.Redis, settings: Settings, catalog: ModeCatalog) -> Callable[[str], LimiterPort]:
    """One shared rate limiter per model name, on ``client``, with the limits of ``settings`` and ``catalog``."""

    @lru_cache(maxsize=64)
    def limiter(model: str) -> LimiterPort:
        name, pause_name = limiter_keys(settings.llm_base_url, model)
        limits = limits_for(model, settings=settings, catalog=catalog)
        return RateLimiter(client, name=name, pause_name=pause_name, limits=limits)

    return limiter


def worker_engine(settings: Settings, *, hostname: str = "") -> Engine:
    """The database engine of a worker process; its repositories' sessions come from it.

    Its pool is the worker kind's (``APTIX_DB_POOL_SIZE`` + ``APTIX_DB_MAX_OVERFLOW``, default 2 + 1),
    shared by every pool thread or greenlet of the process and its reconciler thread: a prefork
    child builds its own. PostgreSQL names its connections ``aptix-worker <hostname>``.
    """
    # No pre-ping: a worker makes about eight transactions per turn, and a step whose connection
    # dropped is run again by the driver (an ``OperationalError`` is "later"), on a fresh pool.
    return engine_for(settings, ProcessKind.WORKER, name=hostname, pre_ping=False)


def build_context(
    settings: Settings,
    *,
    engine: Engine,
    hostname: str,
    llm: LlmPort | None = None,
    metrics: WorkerMetrics | None = None,
    client: redis.Redis | None = None,
    outbox: WebhookOutbox | None = None,
    webhook_sender: WebhookSender | None = None,
) -> StepContext:
    """Build the context of a worker process from its settings (nothing connects until first use).

    Args:
        settings: the worker's settings.
        engine: the process's database engine (:func:`worker_engine`); its owner disposes of it.
        hostname: the worker node's name, stamped on trace steps and lease owners.
        llm: the model client; a Responses API client for ``settings`` when None.
        metrics: the process's collectors; a private set when None.
        client: the state store's Redis (:func:`state_client`); a new one for ``settings`` when None.
        outbox: records the turns' webhook events at their commit points; none when None.
        webhook_sender: sends the deliveries ``outbox`` recorded once committed; none when None.

    Returns:
        The context every step of this process receives.
    """
    from workers.llm.client import ResponsesClient  # the client owns a connection pool; build it here only

    db = session_factory(engine)
    catalog = load_catalog(settings.modes_file)
    client = client or state_client(settings)
    store = RedisStateStore(client, max_events=settings.events_max_per_turn)
    return StepContext(
        settings=settings,
        states=store,
        cancel_flags=store,
        in_flight=store,
        timers=store,
        events=RedisTurnEventLog(
            client, ttl_seconds=settings.state_ttl_seconds, max_events=settings.events_max_per_turn
        ),
        sessions=SessionRepository(db),
        turns=TurnRepository(db, webhooks=outbox),
        tool_runs=ToolRunRepository(db),
        catalog=catalog,
        tools=ToolRegistry.from_catalog(catalog),
        executor=ToolExecutor(settings.tool_threads),
        llm=llm
        or ResponsesClient(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key.get_secret_value(),
            timeout=settings.llm_timeout_seconds,
        ),
        breaker=breakers_on(client, settings),
        leases=lease_renewer(store, settings),
        hostname=hostname,
        metrics=metrics or WorkerMetrics(),
        limiter=limiters_on(client, settings, catalog),
        admission=AdmissionQueue(client),
        webhook_sender=webhook_sender,
        batch_slots=BatchSlots(settings.gevent_batch_slots) if settings.gevent_batch_slots and green() else None,
    )


def state_client(settings: Settings) -> redis.Redis:
    """A worker process's client of the state store's Redis (``APTIX_REDIS_URL``), on a pool of its own."""
    return connect(
        settings.redis_url, max_connections=settings.redis_max_connections, sentinel_password=settings.sentinel_password
    )


def lease_renewer(leases: StepLeases, settings: Settings) -> LeaseRenewer:
    """The renewer of a process's step leases (``APTIX_STEP_LEASE_SECONDS``)."""

    def alive_until() -> float:
        return utc_now().timestamp() + settings.reconciler_deadline_seconds

    return LeaseRenewer(leases, ttl_seconds=settings.step_lease_seconds, alive_until=alive_until)
