"""In-process fakes for unit tests: a StepContext on SQLite in memory, MemoryStateStore, a scripted LLM."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.pool import StaticPool
from sqlalchemy import create_engine

from shared.db import session_factory
from shared.db.sessions import SessionRepository
from shared.db.tables import Base
from shared.db.turns import TurnRepository
from shared.modes import load_catalog
from shared.settings import Settings
from shared.state import MemoryStateStore, TurnState
from workers.context import StepContext
from workers.llm.types import LlmResponse
from workers.tools import ToolRegistry

FIXED_NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


class FakeLlm:
    """Answers each request with the next scripted response (or raises it, if it is an exception)."""

    def __init__(self, *answers: LlmResponse | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    def create(self, request: dict[str, Any]) -> LlmResponse:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def make_context(llm: FakeLlm | None = None, **settings: Any) -> StepContext:
    """A StepContext with every port in process."""
    engine = create_engine("sqlite://", connect_args={"check_same_thread": False}, poolclass=StaticPool)
    Base.metadata.create_all(engine)
    db = session_factory(engine)
    catalog = load_catalog()
    clock: Callable[[], datetime] = lambda: FIXED_NOW  # noqa: E731
    return StepContext(
        settings=Settings(**settings),
        store=MemoryStateStore(),
        db=db,
        sessions=SessionRepository(db),
        turns=TurnRepository(db),
        catalog=catalog,
        tools=ToolRegistry.from_catalog(catalog),
        llm=llm or FakeLlm(),
        clock=clock,
        hostname="unit-host",
    )


def make_state(**fields: Any) -> TurnState:
    """A turn state in mode general, ready for the reasoner."""
    values: dict[str, Any] = {
        "turn_id": "turn_" + "0" * 32,
        "session_id": "sess_" + "0" * 32,
        "org_id": "org",
        "user_id": "user",
        "new_session": True,
        "mode": "general",
        "user_input": "hello",
        "transcript": [{"type": "message", "role": "user", "content": "hello"}],
    }
    values.update(fields)
    return TurnState(**values)
