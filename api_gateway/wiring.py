"""GatewayWiring: what the gateway's routes see, built once by ``create_app`` through :func:`connect_gateway`.

The routes call services; the ports those services are built on (repositories, the state store,
the broker step messages go to, the event log, the clock) stay inside :func:`connect_gateway`, which wires them on
the connections :func:`open_ports` opens (or on in-process ones a unit test passes as
:class:`GatewayPorts`).
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
import redis.asyncio as aioredis
from celery import Celery
from sqlalchemy import Engine

from api_gateway.authenticator import Authenticator
from api_gateway.metrics import GatewayMetrics
from api_gateway.openai.batch_files import BatchFiles
from api_gateway.openai.batch_jobs import BatchJobs, JobPorts
from api_gateway.openai.batch_service import OpenAIBatchService
from api_gateway.openai.batch_validation import BatchValidation
from api_gateway.openai.conversation_service import ConversationService
from api_gateway.openai.file_service import FileService
from api_gateway.openai.response_service import ResponseService
from api_gateway.openai.streams import ResponseStreams
from api_gateway.services import (
    BatchService,
    EventStreams,
    OrgLimitsService,
    SessionService,
    TurnService,
    WebhookService,
)
from shared.broker import create_producer, send_webhook
from shared.db import session_factory
from shared.db.api_keys import ApiKeyRepository
from shared.db.batches import BatchRepository
from shared.db.conversations import ConversationRepository
from shared.db.engine import ProcessKind, engine_for
from shared.db.openai_batches import OpenAIBatchRepository
from shared.db.openai_files import OpenAIFileRepository
from shared.db.org_settings import OrgSettingsRepository
from shared.db.responses import ResponseRepository
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.db.usage import UsageRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_endpoints import WebhookEndpointRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.db.webhook_secrets import stored_secrets
from shared.modes import ModeCatalog, load_catalog
from shared.redis_clients import async_redis_client, redis_client
from shared.settings import Settings
from shared.state import RedisStateStore
from shared.state.admission import AdmissionQueue
from shared.state.request_rate import RequestRate
from shared.state.token_usage import TokenUsage
from shared.step_sender import Broker, CeleryBroker, StepSender, save_pushes
from shared.turn_events import RedisTurnEventLog
from shared.webhooks import WebhookConfig, WebhookSender

__all__ = ["GatewayPorts", "GatewayWiring", "connect_gateway", "open_ports", "utc_now"]


@dataclass(frozen=True)
class GatewayWiring:
    """What the routes use, built once per process: the services, and what ``/readyz`` pings.

    Routes call the services; ``/readyz`` pings the engine, Redis and the producer.
    """

    settings: Settings
    authenticator: Authenticator
    """Which caller a bearer key stands for (``APTIX_API_KEYS``, then the database's keys)."""
    engine: Engine
    """The database engine (``/readyz`` pings it)."""
    catalog: ModeCatalog
    """The modes (``GET /v1/modes``)."""
    producer: Celery
    """The producer-only Celery app (``/readyz`` checks its broker)."""
    redis: redis.Redis
    """The state store's Redis (``/readyz`` pings it)."""
    metrics: GatewayMetrics
    turn_service: TurnService
    batch_service: BatchService
    session_service: SessionService
    webhook_service: WebhookService
    conversation_service: ConversationService
    """Sessions as OpenAI conversations (``/openai/v1/conversations``)."""
    event_streams: EventStreams
    """Serves turns' events as Server-Sent Events (an asyncio Redis connection per stream)."""
    response_service: ResponseService
    """The OpenAI face's Responses over turns (``/openai/v1/responses``)."""
    response_streams: ResponseStreams
    """Serves responses' events in OpenAI's types (``stream: true``), on the event streams' Redis client."""
    file_service: FileService
    """The OpenAI face's files (``/openai/v1/files``)."""
    openai_batch_service: OpenAIBatchService
    """The OpenAI face's batches over Aptix batches (``/openai/v1/batches``)."""
    openai_batch_jobs: BatchJobs
    """Runs the OpenAI face's batch jobs (validation, writing the files of an ended batch) off the requests."""
    limits: OrgLimitsService
    """Each organisation's requests per minute and daily tokens (``aptix orgs set``), and its usage."""


def utc_now() -> datetime:
    """The wall clock, timezone-aware (the gateway's clock)."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class GatewayPorts:
    """What the gateway's services are built on: :func:`open_ports` connects them from the settings;
    a unit test passes in-process ones (SQLite, fakeredis, a broker that records) to the same wiring."""

    engine: Engine
    redis: redis.Redis
    """The state store's, event logs' and admission's client."""
    follower: aioredis.Redis
    """The asyncio client turn event streams and response streams read on."""
    producer: Celery
    broker: Broker
    """Where the gateway's step messages go (``shared.step_sender``): ``producer``'s queues."""
    clock: Callable[[], datetime] = utc_now


def open_ports(settings: Settings) -> GatewayPorts:
    """The gateway's connections, opened lazily: nothing is contacted until a request needs it."""
    producer = create_producer(settings)
    follower = async_redis_client(
        settings.redis_url,
        sentinel_password=settings.sentinel_password,
        # Turn event streams and response streams each take up to events_max_streams connections.
        max_connections=2 * settings.events_max_streams + 16,
        socket_connect_timeout=2,
        socket_timeout=settings.events_keepalive_seconds + 10,  # above the longest XREAD BLOCK
    )
    return GatewayPorts(
        engine=engine_for(settings, ProcessKind.GATEWAY, name=socket.gethostname()),
        redis=redis_client(
            settings.redis_url, sentinel_password=settings.sentinel_password, socket_timeout=2, socket_connect_timeout=2
        ),
        follower=follower,
        producer=producer,
        # No publish retries: a refused send is a 503 at once, and the client tries again.
        broker=CeleryBroker(producer, retry=False, boundaries=settings.task_boundaries),
    )


def connect_gateway(settings: Settings, ports: GatewayPorts | None = None) -> GatewayWiring:
    """Build the gateway's services on its ports.

    Args:
        settings: the gateway's settings.
        ports: what to build on; :func:`open_ports` of ``settings`` when None (every process but a unit test's).

    Returns:
        The state ``create_app`` keeps for its routes.
    """
    ports = ports or open_ports(settings)
    engine, client, producer, clock = ports.engine, ports.redis, ports.producer, ports.clock
    db = session_factory(engine)
    webhooks = WebhookConfig.from_settings(settings, stored=stored_secrets(db))
    sessions = SessionRepository(db)
    outbox = WebhookOutbox(webhooks) if webhooks.enabled else None
    turns = TurnRepository(db, webhooks=outbox)
    batches = BatchRepository(db)
    catalog = load_catalog(settings.modes_file)
    webhook_service = WebhookService(
        config=webhooks, deliveries=WebhookDeliveryRepository(db), turns=turns, batches=batches,
        endpoints=WebhookEndpointRepository(db),
    )  # fmt: skip
    store = RedisStateStore(client, max_events=settings.events_max_per_turn)
    # The gateway sends first steps and re-entries now, never after a countdown: nothing it sends is
    # parked (the waits the workers park are the retry policy's, ``workers.retry.park_after``).
    steps = StepSender(ports.broker, timers=store, park_after=math.inf, pushes=save_pushes(ports.broker, settings))
    events = RedisTurnEventLog(client, ttl_seconds=settings.state_ttl_seconds, max_events=settings.events_max_per_turn)
    metrics = GatewayMetrics()
    limits = OrgLimitsService(
        settings=OrgSettingsRepository(db), usage=UsageRepository(db), rate=RequestRate(ports.follower),
        tokens=TokenUsage(client), clock=clock,
    )  # fmt: skip
    turn_service = TurnService(
        settings=settings,
        turns=turns,
        sessions=sessions,
        catalog=catalog,
        states=store,
        cancel_flags=store,
        in_flight=store,
        events=events,
        steps=steps,
        clock=clock,
        metrics=metrics,
        webhooks=webhook_service,
        admission=AdmissionQueue(client),
        webhook_sender=_webhook_sender(webhooks, producer),
        limits=limits,
    )
    event_streams = EventStreams(
        client=ports.follower,
        turns=turn_service,
        max_streams=settings.events_max_streams,
        keepalive_seconds=settings.events_keepalive_seconds,
        ttl_seconds=settings.state_ttl_seconds,
        max_events=settings.events_max_per_turn,
        clock=clock,
    )
    batch_service = BatchService(
        turns=turn_service, batches=batches, max_requests=settings.max_batch_requests, clock=clock,
        webhooks=webhook_service,
    )  # fmt: skip
    response_service = ResponseService(
        settings=settings, turns=turn_service, responses=ResponseRepository(db), sessions=sessions, catalog=catalog,
        clock=clock,
    )  # fmt: skip
    file_service = FileService(
        files=OpenAIFileRepository(db), max_bytes=settings.openai_max_file_bytes,
        max_lines=settings.openai_max_file_lines, clock=clock,
    )  # fmt: skip
    openai_batches = OpenAIBatchRepository(db, outbox=outbox)
    job_ports = JobPorts(
        batches=openai_batches, aptix=batch_service, clock=clock, webhook_sender=_webhook_sender(webhooks, producer)
    )
    openai_batch_jobs = BatchJobs(
        batches=openai_batches, threads=settings.openai_batch_job_threads,
        lease_seconds=settings.openai_batch_job_lease_seconds, clock=clock,
    )  # fmt: skip
    openai_batch_service = OpenAIBatchService(
        batches=openai_batches, aptix=batch_service, aptix_batches=batches, turns=turn_service, files=file_service,
        jobs=openai_batch_jobs,
        validation=BatchValidation(job_ports, aptix_batches=batches, files=file_service, responses=response_service),
        batch_files=BatchFiles(job_ports),
        window_seconds=settings.openai_batch_window_seconds, clock=clock,
    )  # fmt: skip
    authenticator = Authenticator(
        env_keys=settings.accepted_api_keys, keys=ApiKeyRepository(db), cache_size=settings.api_key_cache_size,
        verify_seconds=settings.api_key_verify_seconds, refresh_seconds=settings.api_key_refresh_seconds,
        checks=metrics.api_key_checks, clock=clock,
    )  # fmt: skip
    return GatewayWiring(
        settings=settings,
        authenticator=authenticator,
        engine=engine,
        catalog=catalog,
        producer=producer,
        redis=client,
        metrics=metrics,
        turn_service=turn_service,
        batch_service=batch_service,
        session_service=SessionService(sessions=sessions, turns=turns, catalog=catalog),
        webhook_service=webhook_service,
        conversation_service=ConversationService(
            conversations=ConversationRepository(db), sessions=sessions, catalog=catalog, clock=clock
        ),
        event_streams=event_streams,
        response_service=response_service,
        response_streams=ResponseStreams(
            client=ports.follower,
            max_streams=settings.events_max_streams,
            keepalive_seconds=settings.events_keepalive_seconds,
        ),
        file_service=file_service,
        openai_batch_service=openai_batch_service,
        openai_batch_jobs=openai_batch_jobs,
        limits=limits,
    )


def _webhook_sender(config: WebhookConfig, producer: Celery) -> WebhookSender | None:
    """What sends the webhook event of a turn the gateway ends (cancel, client-tool timeout), once its
    end (with the event, the outbox) committed."""
    if not config.enabled:
        return None

    def first_attempt(delivery_id: str) -> None:
        send_webhook(producer, delivery_id, attempt=1)

    return WebhookSender(first_attempt)
