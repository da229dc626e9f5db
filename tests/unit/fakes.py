"""In-process fakes for unit tests: a StepContext on SQLite in memory, MemoryStateStore, a scripted LLM."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import fakeredis
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from shared.db import session_factory
from shared.db.sessions import SessionRepository
from shared.db.tables import Base
from shared.db.tool_runs import ToolRunRepository
from shared.db.turns import TurnRepository
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.state import MemoryStateStore, TurnState
from workers.context import StepContext, breakers_on, lease_renewer
from workers.llm.types import LlmResponse
from workers.tools import ToolRegistry
from workers.tools.executor import ToolExecutor

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


class Clock:
    """A settable clock (starts at FIXED_NOW)."""

    def __init__(self) -> None:
        self.now = FIXED_NOW

    def __call__(self) -> datetime:
        return self.now


def make_context(
    llm: FakeLlm | None = None,
    *,
    clock: Callable[[], datetime] | None = None,
    catalog: ModeCatalog | None = None,
    **settings: Any,
) -> StepContext:
    """A StepContext with every port in process (the breakers on fakeredis)."""
    engine = create_engine("sqlite://", connect_args={"check_same_thread": False}, poolclass=StaticPool)
    Base.metadata.create_all(engine)
    db = session_factory(engine)
    catalog = catalog or load_catalog()
    resolved = Settings(**settings)
    store = MemoryStateStore()
    return StepContext(
        settings=resolved,
        store=store,
        sessions=SessionRepository(db),
        turns=TurnRepository(db),
        tool_runs=ToolRunRepository(db),
        catalog=catalog,
        tools=ToolRegistry.from_catalog(catalog),
        executor=ToolExecutor(resolved.tool_threads),
        llm=llm or FakeLlm(),
        breaker=breakers_on(fakeredis.FakeRedis(), resolved),
        leases=lease_renewer(store, resolved),
        clock=clock or (lambda: FIXED_NOW),
        random=lambda: 0.5,
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


TOOL_RUNS: dict[str, int] = {}
"""How often :func:`counted_tool` ran, by key."""


def counted_tool(key: str) -> str:
    """An operator tool for unit tests: counts its runs in :data:`TOOL_RUNS`."""
    TOOL_RUNS[key] = TOOL_RUNS.get(key, 0) + 1
    return f"counted {key}"


def catalog_with_counted_tool() -> ModeCatalog:
    """The packaged catalog plus ``counted_tool`` (not idempotent), offered in mode general."""
    from importlib import resources

    import yaml

    raw = yaml.safe_load(resources.files("shared.modes").joinpath("default_catalog.yaml").read_text())
    raw["tools"] = [
        {"name": "counted_tool", "handler": "tests.unit.fakes:counted_tool",
         "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
    ]  # fmt: skip
    for mode in raw["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], "counted_tool"]
    return ModeCatalog.model_validate(raw)
