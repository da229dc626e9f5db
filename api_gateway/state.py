"""GatewayState: the gateway's ports and services, built once by ``create_app``."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
import redis.asyncio as aioredis
from celery import Celery
from sqlalchemy import Engine

from api_gateway.metrics import GatewayMetrics
from api_gateway.openai.conversation_service import ConversationService
from api_gateway.openai.response_service import ResponseService
from api_gateway.openai.streams import ResponseStreams
from api_gateway.services import (
    BatchService,
    EventStreams,
    SessionService,
    TurnService,
    WebhookService,
)
from shared.broker import create_producer, send_webhook
from shared.db import session_factory
from shared.db.batches import BatchRepository
from shared.db.conversations import ConversationRepository
from shared.db.engine import ProcessKind, engine_for
from shared.db.responses import ResponseRepository
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.modes import ModeCatalog, load_catalog
from shared.settings import ApiKey, Settings
from shared.state import RedisStateStore, StateStore
from shared.state.admission import AdmissionQueue
from shared.step_sender import CeleryBroker, StepSender
from shared.turn_events import RedisTurnEventLog, TurnEventLog
from shared.webhooks import WebhookConfig

__all__ = ["GatewayState", "connect_gateway", "utc_now"]


@dataclass(frozen=True)
class GatewayState:
    """The gateway's ports, each built once per process, and the services built on them.

    Routes call the services; ``/readyz`` pings the engine, Redis and the producer.
    """

    settings: Settings
    api_keys: dict[str, ApiKey]
    """Accepted bearer keys, each with its caller's identity."""
    engine: Engine
    """The database engine (``/readyz`` pings it)."""
    sessions: SessionRepository
    turns: TurnRepository
    batches: BatchRepository
    catalog: ModeCatalog
    producer: Celery
    """The producer-only Celery app (``/readyz`` checks its broker)."""
    steps: StepSender
    """Sends turns' first steps through ``producer`` (``shared.step_sender``)."""
    redis: redis.Redis
    store: StateStore
    """The turn state store (cancel flags, in-flight markers, live traces), one for the process."""
    events: TurnEventLog
    """The turns' event logs (Redis Streams): the gateway appends ``turn.cancelled`` to them."""
    clock: Callable[[], datetime]
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


def utc_now() -> datetime:
    """The wall clock, timezone-aware (the gateway's clock)."""
    return datetime.now(UTC)


def connect_gateway(settings: Settings) -> GatewayState:
    """Connect the gateway's ports and build its services (lazily: nothing is contacted until a request needs it).

    Args:
        settings: the gateway's settings.

    Returns:
        The state ``create_app`` keeps for its routes.
    """
    engine = engine_for(settings, ProcessKind.GATEWAY, name=socket.gethostname())
    db = session_factory(engine)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    producer = create_producer(settings)
    webhooks = WebhookConfig.from_settings(settings)
    sessions = SessionRepository(db)
    turns = TurnRepository(db, webhooks=_outbox(webhooks, producer))
    batches = BatchRepository(db)
    catalog = load_catalog(settings.modes_file)
    webhook_service = WebhookService(
        config=webhooks, deliveries=WebhookDeliveryRepository(db), turns=turns, batches=batches
    )
    store = RedisStateStore(client, max_events=settings.events_max_per_turn)
    # No publish retries: a refused send is a 503 at once, and the client tries again.
    steps = StepSender.for_settings(CeleryBroker(producer, retry=False), store, settings)
    events = RedisTurnEventLog(client, ttl_seconds=settings.state_ttl_seconds, max_events=settings.events_max_per_turn)
    metrics = GatewayMetrics()
    turn_service = TurnService(
        settings=settings,
        turns=turns,
        sessions=sessions,
        catalog=catalog,
        store=store,
        events=events,
        steps=steps,
        clock=utc_now,
        metrics=metrics,
        webhooks=webhook_service,
        admission=AdmissionQueue(client),
    )
    follower = aioredis.Redis.from_url(
        settings.redis_url,
        # Turn event streams and response streams each take up to events_max_streams connections.
        max_connections=2 * settings.events_max_streams + 16,
        socket_connect_timeout=2,
        socket_timeout=settings.events_keepalive_seconds + 10,  # above the longest XREAD BLOCK
    )
    event_streams = EventStreams(
        client=follower,
        turns=turn_service,
        max_streams=settings.events_max_streams,
        keepalive_seconds=settings.events_keepalive_seconds,
        ttl_seconds=settings.state_ttl_seconds,
        max_events=settings.events_max_per_turn,
        clock=utc_now,
    )
    return GatewayState(
        settings=settings,
        api_keys=settings.accepted_api_keys,
        engine=engine,
        sessions=sessions,
        turns=turns,
        batches=batches,
        catalog=catalog,
        producer=producer,
        steps=steps,
        redis=client,
        store=store,
        events=events,
        clock=utc_now,
        metrics=metrics,
        turn_service=turn_service,
        batch_service=BatchService(
            turns=turn_service,
            batches=batches,
            max_requests=settings.max_batch_requests,
            clock=utc_now,
            webhooks=webhook_service,
        ),
        session_service=SessionService(sessions=sessions, turns=turns, catalog=catalog),
        webhook_service=webhook_service,
        conversation_service=ConversationService(
            conversations=ConversationRepository(db), sessions=sessions, catalog=catalog, clock=utc_now
        ),
        event_streams=event_streams,
        response_service=ResponseService(
            settings=settings,
            turns=turn_service,
            responses=ResponseRepository(db),
            sessions=sessions,
            catalog=catalog,
            clock=utc_now,
        ),
        response_streams=ResponseStreams(
            client=follower,
            max_streams=settings.events_max_streams,
            keepalive_seconds=settings.events_keepalive_seconds,
        ),
    )


def _outbox(config: WebhookConfig, producer: Celery) -> WebhookOutbox | None:
    """What records the webhook event of a turn the gateway ends (cancel, client-tool timeout)."""
    if not config.enabled:
        return None

    def first_attempt(delivery_id: str) -> None:
        send_webhook(producer, delivery_id, attempt=1)

    return WebhookOutbox(config, first_attempt)
