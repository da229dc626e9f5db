"""In-process fakes for unit tests: a StepContext on SQLite in memory, MemoryStateStore, a scripted LLM,
the gateway as ``connect_gateway`` wires it on in-process ports, a broker that keeps the step messages it
is given, and builders of envelopes, recorded turns and model answers.

Every unit test that needs a database takes it from :func:`sqlite_engine` (or :func:`sqlite_db`)."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import fakeredis
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from api_gateway.wiring import GatewayPorts, connect_gateway
from shared.broker import create_producer
from shared.db import session_factory
from shared.db.sessions import SessionRepository
from shared.db.tables import Base
from shared.db.tool_runs import ToolRunRepository
from shared.db.turns import NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.envelope import TurnEnvelope
from shared.models.turn import PendingToolCall, TurnRequest, TurnStatus, Usage
from shared.modes import ModeCatalog, load_catalog
from shared.settings import Settings
from shared.state import CancelFlags, InFlightMarkers, MemoryStateStore, RedisStateStore, TurnState
from shared.state.admission import AdmissionQueue
from shared.task_names import StepName
from shared.turn_events import MemoryTurnEventLog, RedisTurnEventLog, TurnEvent
from shared.webhooks import WebhookSender
from workers.context import StepContext, breakers_on, lease_renewer
from workers.driver import Dispatch, run_step
from workers.llm.types import FunctionCall, LlmResponse
from workers.tools import ToolRegistry
from workers.tools.executor import ToolExecutor

FIXED_NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
TURN_ID = "turn_" + "1" * 32
"""The turn :func:`record_turn` records (unless told another)."""
SESSION_ID = "sess_" + "1" * 32
ORG, USER = "org_a", "user_a"
"""The caller of the gateway's services in :class:`Gateway` tests."""
CLIENT_TOOL_TIMEOUT_SECONDS = 60
"""How long a :class:`Gateway`'s paused turn waits for client tool results."""


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


def sqlite_engine() -> Engine:
    """A fresh SQLite database in memory with every table (a copy of one schema built once), on one
    connection any thread may use: the one database engine of unit tests."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    _schema().backup(connection)
    return create_engine("sqlite://", creator=lambda: connection, poolclass=StaticPool)


def sqlite_db() -> sessionmaker[Session]:
    """A session factory on a fresh :func:`sqlite_engine`."""
    return session_factory(sqlite_engine())


def make_context(
    llm: FakeLlm | None = None,
    *,
    clock: Callable[[], datetime] | None = None,
    catalog: ModeCatalog | None = None,
    outbox: WebhookOutbox | None = None,
    webhook_sender: WebhookSender | None = None,
    engine: Engine | None = None,
    **settings: Any,
) -> StepContext:
    """A StepContext with every port in process (one MemoryStateStore behind every state port, the
    breakers on fakeredis, a fresh :func:`sqlite_engine` unless ``engine`` is given); its turn
    repository records webhook events in ``outbox`` when given, and ``webhook_sender`` sends them.

    Its steps end their task at every layer (``task_boundaries="layer"``) unless ``task_boundaries`` says
    otherwise: driving a turn a message at a time, a test then sees each rule at each layer's step (the
    default, ``call``, is tested where a test names it)."""
    db = session_factory(engine or sqlite_engine())
    catalog = catalog or _default_catalog()
    resolved = Settings(**{"task_boundaries": "layer", **settings})
    events = MemoryTurnEventLog()
    store = MemoryStateStore(events)
    return StepContext(
        settings=resolved,
        states=store,
        cancel_flags=store,
        in_flight=store,
        timers=store,
        events=events,
        sessions=SessionRepository(db),
        turns=TurnRepository(db, webhooks=outbox),
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
        webhook_sender=webhook_sender,
    )


def with_store(ctx: StepContext, store: MemoryStateStore) -> StepContext:
    """``ctx`` with ``store`` behind every state port and the lease renewer, as one Redis is in production."""
    return replace(
        ctx, states=store, cancel_flags=store, in_flight=store, timers=store, leases=lease_renewer(store, ctx.settings)
    )


def memory_store(ctx: StepContext) -> MemoryStateStore:
    """The one MemoryStateStore behind every state port of a :func:`make_context` context."""
    assert isinstance(ctx.states, MemoryStateStore)
    return ctx.states


class Gateway:
    """The gateway's services as ``connect_gateway`` wires them, on in-process ports, and the ports to look at.

    The ports: SQLite in memory, fakeredis (the state store, event logs and fair admission, as in
    production), a :class:`FakeBroker` and a settable :class:`Clock`. Settings default to a
    60 s client tool timeout and batches of at most 3 requests. ``GatewayWiring`` keeps only what the
    routes use, so what a test looks at besides the services (the repositories, the cancel flags and
    in-flight markers, the event logs, admission) is opened here on the same database and Redis.
    """

    def __init__(self, **settings: Any) -> None:
        options: dict[str, Any] = {
            "client_tool_timeout_seconds": CLIENT_TOOL_TIMEOUT_SECONDS, "max_batch_requests": 3,
            "openai_batch_job_threads": 0,  # the tests run the batch jobs themselves: wired.openai_batch_jobs.drain()
        }  # fmt: skip
        self.settings = Settings(**{**options, **settings})
        self.redis_server = fakeredis.FakeServer()
        """Its Redis: ``redis_server.connected = False`` makes every call refuse."""
        self.broker = FakeBroker()
        """Where the gateway's step messages go (``broker.sent``; ``broker.refuse`` makes it refuse)."""
        self.clock = Clock()
        ports = GatewayPorts(
            engine=sqlite_engine(),
            redis=fakeredis.FakeRedis(server=self.redis_server),
            follower=fakeredis.FakeAsyncRedis(server=self.redis_server),
            producer=create_producer(self.settings),
            broker=self.broker,
            clock=self.clock,
        )
        self.engine = ports.engine
        """Its database (SQLite in memory), for counting what a service sends it."""
        self.wired = connect_gateway(self.settings, ports)
        """Everything ``connect_gateway`` built."""
        self.service = self.wired.turn_service
        self.batches = self.wired.batch_service
        self.session_reads = self.wired.session_service
        self.conversations = self.wired.conversation_service
        self.metrics = self.wired.metrics
        db = session_factory(ports.engine)
        self.turns = TurnRepository(db)
        """The turns' rows, for setting a turn up as the pipeline would leave it (no webhook outbox)."""
        self.sessions = SessionRepository(db)
        store = RedisStateStore(ports.redis, max_events=self.settings.events_max_per_turn)
        self.cancel_flags: CancelFlags = store
        self.in_flight: InFlightMarkers = store
        self.admission = AdmissionQueue(ports.redis)
        """The organisations' admission queues, as the gateway's turn service keeps them."""
        self._events = RedisTurnEventLog(
            ports.redis, ttl_seconds=self.settings.state_ttl_seconds, max_events=self.settings.events_max_per_turn
        )

    def session(self) -> str:
        """A session of ORG, as the pipeline's session creator leaves it."""
        session_id = "sess_" + "1" * 32
        self.sessions.create_if_absent(session_id=session_id, org_id=ORG, user_id=USER, mode="general", now=FIXED_NOW)
        return session_id

    def paused_turn(self, session_id: str) -> str:
        """A turn of ``session_id`` waiting for the result of client call ``call_1`` since now."""
        turn_id = self.service.record(TurnRequest(session_id=session_id, input="hi"), org_id=ORG, user_id=USER).turn_id
        outcome = TurnOutcome(
            status=TurnStatus.REQUIRES_CLIENT_TOOLS, mode="general", output_text=None,
            pending_tool_calls=[PendingToolCall(call_id="call_1", name="lookup", arguments="{}")], mode_changes=[],
            error=None, usage=Usage(), trace=[],
        )  # fmt: skip
        self.turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=self.clock())
        return turn_id

    def held(self) -> int:
        """How many of ORG's turns wait in its admission queue."""
        counts = self.admission.counts().get(ORG)
        return 0 if counts is None else counts.held

    def events(self, turn_id: str) -> list[TurnEvent]:
        """Every event in the turn's log."""
        return self._events.read(turn_id, after=None, block_ms=0, count=10_000)

    def accepted(self, kind: str) -> float:
        """``aptix_turns_accepted_total`` of ``kind``."""
        value = self.metrics.registry.get_sample_value("aptix_turns_accepted_total", {"kind": kind})
        return 0.0 if value is None else value

    def finished(self, status: str, code: str) -> float:
        """``aptix_turns_finished_total`` of ``status`` and ``code``."""
        value = self.metrics.registry.get_sample_value("aptix_turns_finished_total", {"status": status, "code": code})
        return 0.0 if value is None else value


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
