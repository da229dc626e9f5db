"""In-process fakes for unit tests: a StepContext on SQLite in memory, MemoryStateStore, a scripted LLM,
a broker that keeps the step messages it is given, and builders of envelopes, recorded turns and model answers."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import fakeredis
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import StaticPool

from shared.db import session_factory
from shared.db.sessions import SessionRepository
from shared.db.tables import Base
from shared.db.tool_runs import ToolRunRepository
from shared.db.turns import NewTurn, TurnRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.envelope import TurnEnvelope
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.state import MemoryStateStore, TurnState
from shared.task_names import StepName
from shared.turn_events import MemoryTurnEventLog
from workers.context import StepContext, breakers_on, lease_renewer
from workers.driver import Dispatch, run_step
from workers.llm.types import FunctionCall, LlmResponse
from workers.tools import ToolRegistry
from workers.tools.executor import ToolExecutor

FIXED_NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
TURN_ID = "turn_" + "1" * 32
"""The turn :func:`record_turn` records (unless told another)."""
SESSION_ID = "sess_" + "1" * 32


class FakeLlm:
    """Answers each request with the next scripted response (or raises it, if it is an exception)."""

    def __init__(self, *answers: LlmResponse | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self.streamed = 0
        """How many of the requests were streamed."""

    def create(self, request: dict[str, Any]) -> LlmResponse:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def stream(
        self,
        request: dict[str, Any],
        on_text: Callable[[str], None],
        *,
        on_text_done: Callable[[], None] | None = None,
    ) -> LlmResponse:
        """As :meth:`create`, streamed: an answer's text goes to ``on_text`` word by word first."""
        self.streamed += 1
        answer = self.create(request)
        for word in re.findall(r"\s*\S+", answer.output_text or ""):
            on_text(word)
        if answer.output_text and on_text_done is not None:
            on_text_done()
        return answer


class FakeBroker:
    """A ``shared.step_sender.Broker`` that keeps what it is asked to publish; raises ``refuse`` instead when set."""

    def __init__(self) -> None:
        self.published: list[tuple[TurnEnvelope, float]] = []
        """Each envelope published, with its countdown."""
        self.refuse: Exception | None = None

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.published.extend((envelope, countdown) for envelope in envelopes)

    @property
    def sent(self) -> list[TurnEnvelope]:
        """The envelopes published, in order."""
        return [envelope for envelope, _countdown in self.published]


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
    webhooks: WebhookOutbox | None = None,
    **settings: Any,
) -> StepContext:
    """A StepContext with every port in process (the breakers on fakeredis); its turn repository records
    webhook events in ``webhooks`` when given."""
    engine = _sqlite_engine()
    db = session_factory(engine)
    catalog = catalog or _default_catalog()
    resolved = Settings(**settings)
    events = MemoryTurnEventLog()
    store = MemoryStateStore(events)
    return StepContext(
        settings=resolved,
        store=store,
        events=events,
        sessions=SessionRepository(db),
        turns=TurnRepository(db, webhooks=webhooks),
        tool_runs=ToolRunRepository(db),
        catalog=catalog,
        tools=_registry(catalog),
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


@cache
def catalog_with_counted_tool() -> ModeCatalog:
    """The packaged catalog plus ``counted_tool`` (not idempotent), offered in mode general.

    Built once: tests must not change it.
    """
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


def envelope(
    step: StepName,
    *,
    turn_id: str = TURN_ID,
    round: int = 0,
    hop: int = 0,
    iteration: int = 0,
    attempt: int = 0,
) -> TurnEnvelope:
    """The envelope of ``step`` of ``turn_id``: the one place unit tests build envelopes.

    Args:
        step: the step the message runs.
        turn_id: the turn.
        round: how often the turn was entered before (1 for the first tool-results re-entry).
        hop: the message's position in its round's chain.
        iteration: the LLM call the step belongs to.
        attempt: how often this same step was tried before.
    """
    return TurnEnvelope(turn_id=turn_id, step=step, round=round, hop=hop, iteration=iteration, attempt=attempt)


def record_turn(
    ctx: StepContext,
    text: str = "hello",
    *,
    turn_id: str = TURN_ID,
    session_id: str = SESSION_ID,
    new_session: bool = True,
    tools: list[dict[str, Any]] | None = None,
    created_at: datetime = FIXED_NOW,
    stream: bool = False,
    extras: dict[str, Any] | None = None,
) -> TurnEnvelope:
    """Record a queued turn as the gateway does (at ``created_at``); returns its first message.

    ``extras`` are recorded under the request's ``extras`` key (``shared.openai.TurnExtras``), as the
    OpenAI face records them.
    """
    request: dict[str, Any] = {"input": text}
    if tools is not None:
        request["tools"] = tools
    if stream:
        request["stream"] = True
    if extras is not None:
        request["extras"] = extras
    ctx.turns.create(
        NewTurn(turn_id=turn_id, session_id=session_id, org_id="o", user_id="u", new_session=new_session,
                requested_mode=None, request=request, request_hash="h"),
        now=created_at, deadline_at=created_at + timedelta(seconds=60),
    )  # fmt: skip
    return envelope(StepName.REQUEST_HANDLER, turn_id=turn_id)


def drive(ctx: StepContext, env: TurnEnvelope, *, until: StepName | None = None) -> list[Dispatch]:
    """Run messages one after another (ignoring countdowns) until the chain ends or is about to run ``until``.

    Returns:
        Every message sent, in order.
    """
    sent: list[Dispatch] = []
    dispatch: Dispatch | None = Dispatch(env)
    while dispatch is not None and dispatch.envelope.step is not until:
        dispatch = run_step(ctx, dispatch.envelope)
        if dispatch is not None:
            sent.append(dispatch)
    return sent


def answer(text: str, response_id: str = "r") -> LlmResponse:
    """A model answer that ends the turn."""
    return LlmResponse(response_id=response_id, output_text=text)


def calls(*named: tuple[str, str, dict[str, Any]], response_id: str = "r") -> LlmResponse:
    """A model answer that calls tools: ``(call_id, name, arguments)`` each."""
    function_calls = tuple(
        FunctionCall(call_id=call_id, name=name, arguments=json.dumps(arguments)) for call_id, name, arguments in named
    )
    return LlmResponse(response_id=response_id, output_text=None, function_calls=function_calls)


def failing_tool(reason: str) -> str:
    """An operator tool for unit tests that always raises."""
    raise RuntimeError(reason)


def context_tool(context: dict[str, str]) -> dict[str, str]:
    """An operator tool for unit tests that returns the tool context it was given (a dict: sent as JSON)."""
    return context


@cache
def catalog_with_unit_tools() -> ModeCatalog:
    """The packaged catalog plus ``counted_tool``, ``failing_tool`` and ``context_tool``, offered in mode general.

    Built once: tests must not change it.
    """
    catalog = catalog_with_counted_tool()
    raw = catalog.model_dump(mode="json", by_alias=True, exclude_none=True)
    raw["tools"] += [
        {"name": "failing_tool", "handler": "tests.unit.fakes:failing_tool",
         "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]}},
        {"name": "context_tool", "handler": "tests.unit.fakes:context_tool",
         "parameters": {"type": "object", "properties": {}}},
    ]  # fmt: skip
    for mode in raw["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], "failing_tool", "context_tool"]
    return ModeCatalog.model_validate(raw)


def _sqlite_engine() -> Engine:
    """A fresh SQLite database in memory with every table: a copy of one schema built once."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    _schema().backup(connection)
    return create_engine("sqlite://", creator=lambda: connection, poolclass=StaticPool)


@cache
def _schema() -> sqlite3.Connection:
    """An empty database with every table (creating them costs more than copying them)."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    Base.metadata.create_all(create_engine("sqlite://", creator=lambda: connection, poolclass=StaticPool))
    return connection


_REGISTRIES: dict[int, tuple[ModeCatalog, ToolRegistry]] = {}
"""Registries built so far, by catalog (kept alive with it): building one checks every tool's schema."""


def _registry(catalog: ModeCatalog) -> ToolRegistry:
    """The tool registry of ``catalog``, built once per catalog (registries are never changed)."""
    if id(catalog) not in _REGISTRIES:
        _REGISTRIES[id(catalog)] = (catalog, ToolRegistry.from_catalog(catalog))
    return _REGISTRIES[id(catalog)][1]


@cache
def _default_catalog() -> ModeCatalog:
    return load_catalog()
