"""GatewayState: the gateway's ports, built once by ``create_app``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api_gateway.metrics import GatewayMetrics
from shared.broker import create_producer
from shared.db import create_db_engine, session_factory
from shared.db.batches import BatchRepository
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.modes import ModeCatalog, load_catalog
from shared.settings import ApiKey, Settings
from shared.state import RedisStateStore

__all__ = ["GatewayState", "build_state"]


@dataclass(frozen=True)
class GatewayState:
    """Everything a route may use."""

    settings: Settings
    api_keys: dict[str, ApiKey]
    engine: Engine
    db: sessionmaker[Session]
    sessions: SessionRepository
    turns: TurnRepository
    batches: BatchRepository
    catalog: ModeCatalog
    producer: Celery
    redis: redis.Redis
    store: RedisStateStore
    """The turn state store (cancel flags, in-flight markers, live traces)."""
    metrics: GatewayMetrics

    def deadline(self) -> datetime:
        """The reconciler deadline of a turn accepted or resumed now."""
        return datetime.now(UTC) + timedelta(seconds=self.settings.reconciler_deadline_seconds)


def build_state(settings: Settings) -> GatewayState:
    """Connect the gateway's ports (lazily: nothing is contacted until a request needs it)."""
    engine = create_db_engine(settings.database_url)
    db = session_factory(engine)
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    return GatewayState(
        settings=settings,
        api_keys=settings.accepted_api_keys,
        engine=engine,
        db=db,
        sessions=SessionRepository(db),
        turns=TurnRepository(db),
        batches=BatchRepository(db),
        catalog=load_catalog(settings.modes_file),
        producer=create_producer(settings),
        redis=client,
        store=RedisStateStore(client),
        metrics=GatewayMetrics(),
    )
