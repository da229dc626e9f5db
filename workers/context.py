"""StepContext: everything a step may touch, built once per worker process and passed explicitly."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from shared.db import create_db_engine, session_factory
from shared.db.sessions import SessionRepository
from shared.db.turns import TurnRepository
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.state import RedisStateStore, StateStore
from workers.llm.types import LlmResponse
from workers.tools.registry import ToolRegistry

__all__ = ["LlmPort", "StepContext", "build_context", "utc_now"]


class LlmPort(Protocol):
    """The one thing steps need from the LLM client."""

    def create(self, request: dict[str, Any]) -> LlmResponse:
        """Send one Responses API request."""


def utc_now() -> datetime:
    """The wall clock, timezone-aware."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class StepContext:
    """The ports of one worker process."""

    settings: Settings
    store: StateStore
    db: sessionmaker[Session]
    sessions: SessionRepository
    turns: TurnRepository
    catalog: ModeCatalog
    tools: ToolRegistry
    llm: LlmPort
    clock: Callable[[], datetime] = utc_now
    hostname: str = socket.gethostname()

    @property
    def state_ttl_seconds(self) -> int:
        """How long Redis keeps a turn's state; past the client-tool timeout the snapshot takes over."""
        return max(86400, self.settings.client_tool_timeout_seconds + 3600)


def build_context(settings: Settings, *, hostname: str | None = None, llm: LlmPort | None = None) -> StepContext:
    """Build the context of a worker process from its settings."""
    from workers.llm.client import ResponsesClient  # the client owns a connection pool; build it here only

    engine = create_db_engine(settings.database_url)
    db = session_factory(engine)
    catalog = load_catalog(settings.modes_file)
    return StepContext(
        settings=settings,
        store=RedisStateStore.from_url(settings.redis_url),
        db=db,
        sessions=SessionRepository(db),
        turns=TurnRepository(db),
        catalog=catalog,
        tools=ToolRegistry.from_catalog(catalog),
        llm=llm
        or ResponsesClient(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key.get_secret_value(),
            timeout=settings.llm_timeout_seconds,
        ),
        hostname=hostname or socket.gethostname(),
    )
