"""One turn, one trace: the gateway's requests and every task of the turn share the turn's trace id,
through a server tool call, a client-tool pause and resume, and a reconciler re-drive; and a step
message carries its turn's trace context and is otherwise what ``send_task`` sends.

The gateway app and a Celery worker run in this one process (as in ``aptix dev``), on the real
Redis and PostgreSQL, with spans kept in memory.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery import _state as celery_state
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api_gateway.app import create_app
from scripted_llm import ScriptedServer
from shared.broker import create_producer
from shared.db import create_db_engine, session_factory
from shared.db.turns import TurnRepository
from shared.logging import set_process_fields
from shared.settings import Settings
from shared.state import RedisStateStore
from shared.state.keys import RECONCILER_LEADER_KEY
from shared.state.leader import LeaderLease
from shared.step_sender import CeleryBroker
from shared.telemetry import start_telemetry, stop_telemetry, turn_spans
from shared.telemetry_sdk import turn_ids
from shared.turn_ending import TurnEnding
from tests.conftest import API_KEYS, KEY_A, redis_databases
from tests.integration.conftest import OPEN_FILE
from tests.support.databases import fresh_database
from tests.support.step_messages import ENVELOPES, messages, send_task, step_sender, without_ids
from tests.support.waiting import wait_for
from workers.app import create_celery
from workers.broker_watch import RedisBrokerWatch
from workers.context import utc_now
from workers.metrics import WorkerMetrics
from workers.reconciler import Reconciler
from workers.runtime import build_step_sender

pytestmark = pytest.mark.integration

HEADERS = {"Authorization": f"Bearer {KEY_A}"}
# The default APTIX_TASK_BOUNDARIES=call: a task per model or tool call (docs/pipeline.md, "Task boundaries")
SERVER_TOOL_HOPS = 3  # entry (and the first model call), execute_server_tools, llm_call
CLIENT_TOOL_HOPS = 2  # the entry (and its model call) until the pause, the same after the results
PLAIN_HOPS = 1  # the entry, which makes the model call


@dataclass
class Traced:
    """The running gateway (a test client) and the spans every part of the process exported."""

    client: TestClient
    spans: InMemorySpanExporter
    settings: Settings
    worker_app: Celery

    def post_turn(self, body: dict[str, Any], *, wait: float | None = 30) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        response = self.client.post("/v1/turns", json=body, headers=HEADERS, params=params)
        assert response.status_code in (200, 202), response.text
        turn: dict[str, Any] = response.json()
        return turn

    def wait_turn(self, turn_id: str) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            turn: dict[str, Any] = self.client.get(f"/v1/turns/{turn_id}", headers=HEADERS, params={"wait": 5}).json()
            return turn if turn["status"] not in ("queued", "running") else None

        return wait_for(finished, what=f"turn {turn_id} to finish", seconds=60)

    def trace(self, turn_id: str, *, tasks: int) -> list[ReadableSpan]:
        """The spans of the turn's trace, once ``tasks`` of its task spans have ended."""
        trace_id = turn_ids(turn_id)[0]

        def ended() -> list[ReadableSpan] | None:
            spans = [span for span in self.spans.get_finished_spans() if span.context.trace_id == trace_id]
            return spans if len(_task_spans(spans)) >= tasks else None

        return wait_for(ended, what=f"{tasks} task spans of {turn_id}")


@pytest.fixture(scope="module")
def traced(services: None, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    with redis_databases(2) as (state_url, broker_url), fresh_database("aptix_tracing") as database_url:
        settings = Settings(
            database_url=database_url,
            redis_url=state_url,
            broker_url=broker_url,
            llm_base_url=scripted_llm.base_url,
            llm_model="scripted-model",
            api_keys=API_KEYS,
            modes_file=str(modes_file),
            otel_enabled=True,
        )
        start_telemetry(settings, service_name="aptix-test", exporter=exporter)
        # The worker's app is the process's default app, as `celery worker` makes it: an in-process
        # worker's threads run tasks through the default app (and the instrumentation's first publish
        # uses it), and the step tasks are registered on the worker's app alone.
        worker_app = create_celery(settings, reconciler=False)
        previous = celery_state.default_app
        worker_app.set_default()
        try:
            with TestClient(create_app(settings)) as client:
                yield Traced(client=client, spans=exporter, settings=settings, worker_app=worker_app)
        finally:
            stop_telemetry()
            celery_state.set_default_app(previous)


@pytest.fixture(scope="module")
def worker(traced: Traced) -> Iterator[None]:
    """A Celery worker of 4 threads in this process; started by the first test that needs it."""
    app = traced.worker_app
    started = threading.Event()

    class _Worker(app.WorkController):  # type: ignore[name-defined,misc]  # app-bound class
        def on_consumer_ready(self, consumer: Any) -> None:
            super().on_consumer_ready(consumer)
            started.set()

    controller = _Worker(
        app=app, pool_cls="threads", concurrency=4, queues=["pipeline", "llm", "tools"],
        hostname=f"traced@{socket.gethostname()}", without_heartbeat=True, without_mingle=True,
        without_gossip=True, loglevel="WARNING",
    )  # fmt: skip
    threading.Thread(target=controller.start, name="traced-worker", daemon=True).start()
    assert started.wait(30), "the in-process worker did not start"
    yield
    controller.stop(in_sighandler=False)
    set_process_fields(worker=None)  # the in-process worker named this process's log records


def test_a_turn_re_driven_by_the_reconciler_stays_in_one_trace(traced: Traced, request: pytest.FixtureRequest) -> None:
    # Given a turn whose first message was lost before any worker took it (no worker runs yet)
    turn = traced.post_turn({"input": f"hello m{uuid.uuid4().hex[:8]}"}, wait=None)
    broker = redis.Redis.from_url(traced.settings.effective_broker_url)
    assert broker.delete("llm") == 1, "the turn's first message was not waiting in the llm queue (the entry's)"
    # When the reconciler finds it past its deadline and re-drives it, and a worker then runs it
    _reconciler(traced.settings, later=timedelta(hours=2)).scan()
    request.getfixturevalue("worker")
    done = traced.wait_turn(turn["turn_id"])
    spans = traced.trace(turn["turn_id"], tasks=PLAIN_HOPS)
    assert done["status"] == "completed", done
    # Then the re-drive, its message and every task are in the trace the turn's request started
    _assert_one_trace(spans, turn["turn_id"])
    (redrive,) = [span for span in spans if span.name == "reconciler re-drive"]
    assert redrive.parent is not None and redrive.parent.span_id == turn_ids(turn["turn_id"])[1]
    _assert_no_stray_task_span(traced)


def test_a_turn_with_a_server_tool_is_one_trace(traced: Traced, worker: None) -> None:
    turn = traced.post_turn({"input": f"now [[call:get_current_time {{}}]] m{uuid.uuid4().hex[:8]}"})
    assert turn["status"] == "completed", turn
    spans = traced.trace(turn["turn_id"], tasks=SERVER_TOOL_HOPS)
    _assert_one_trace(spans, turn["turn_id"])
    assert {span.attributes.get("aptix.step") for span in _task_spans(spans)} >= {"execute_server_tools"}
    _assert_no_stray_task_span(traced)


def test_a_turn_paused_for_a_client_tool_and_resumed_is_one_trace(traced: Traced, worker: None) -> None:
    # Given a turn paused for a client tool
    directive = "[[call:open_file " + json.dumps({"path": "x"}) + "]]"
    paused = traced.post_turn({"input": f"{directive} m{uuid.uuid4().hex[:8]}", "tools": [OPEN_FILE]})
    assert paused["status"] == "requires_client_tools", paused
    # When the client posts the results (a request of its own, later) and the turn resumes
    call_id = paused["pending_tool_calls"][0]["call_id"]
    posted = traced.client.post(
        f"/v1/turns/{paused['turn_id']}/tool-results",
        json={"tool_results": [{"call_id": call_id, "output": "file body"}]},
        headers=HEADERS,
    )
    assert posted.status_code == 202, posted.text
    assert traced.wait_turn(paused["turn_id"])["status"] == "completed"
    # Then both requests and every task of both rounds are one trace
    spans = traced.trace(paused["turn_id"], tasks=CLIENT_TOOL_HOPS)
    _assert_one_trace(spans, paused["turn_id"])
    (resume,) = [span for span in spans if span.name == "POST /v1/turns/{turn_id}/tool-results"]
    assert resume.parent is not None and resume.parent.span_id == turn_ids(paused["turn_id"])[1]
    _assert_no_stray_task_span(traced)


def test_each_turn_of_a_batch_is_a_trace_of_its_own_linked_to_the_batch_request(traced: Traced, worker: None) -> None:
    # Given a batch of two turns (one request: a trace of its own)
    marker = uuid.uuid4().hex[:8]
    requests = [{"input": f"item {index} m{marker}"} for index in range(2)]
    response = traced.client.post("/v1/batches", json={"requests": requests}, headers=HEADERS)
    assert response.status_code == 202, response.text
    batch_id = response.json()["batch_id"]

    def results() -> list[dict[str, Any]] | None:
        lines = traced.client.get(f"/v1/batches/{batch_id}/results", headers=HEADERS).text.splitlines()
        turns = [json.loads(line) for line in lines]
        return turns if turns and all(turn["status"] == "completed" for turn in turns) else None

    turns = wait_for(results, what=f"batch {batch_id} to complete", seconds=60)
    (request,) = [span for span in traced.spans.get_finished_spans() if span.name == "POST /v1/batches"]
    # Then each turn is one trace, rooted in a span of its own that links to the batch's request
    for turn in turns:
        spans = traced.trace(turn["turn_id"], tasks=PLAIN_HOPS)
        _assert_one_trace(spans, turn["turn_id"], root_name="turn accepted")
        (root,) = [span for span in spans if span.parent is None]
        assert [link.context.span_id for link in root.links] == [request.context.span_id]
    _assert_no_stray_task_span(traced)


def test_a_step_message_carries_its_turns_trace_and_is_otherwise_the_one_send_task_sends(traced: Traced) -> None:
    # Given telemetry on (this module's), no span current (a reconciler thread, say) and a broker of
    # this test's own (the module's worker takes nothing from it)
    with redis_databases(1) as (broker_url,):
        app = create_producer(Settings(broker_url=broker_url, redis_url=broker_url))
        # When each envelope goes through send_task in its turn's trace, then through the step sender
        for envelope in ENVELOPES:
            with turn_spans(envelope.turn_id):
                send_task(app, envelope)
            step_sender(app).send([envelope])
        # Then each message carries its turn's trace, and the two are the same bytes but for their own ids and span
        for envelope in ENVELOPES:
            by_send_task, ours = messages(broker_url, envelope)
            trace_id = turn_ids(envelope.turn_id)[0]
            assert json.loads(ours)["headers"]["traceparent"].split("-")[1] == f"{trace_id:032x}"
            assert without_ids(ours, ids=("traceparent",)) == without_ids(by_send_task, ids=("traceparent",))


def _assert_one_trace(spans: list[ReadableSpan], turn_id: str, *, root_name: str = "POST /v1/turns") -> None:
    """The turn's spans form one tree under its root (the request that created it), holding all its tasks."""
    trace_id, root_span_id = turn_ids(turn_id)
    (root,) = [span for span in spans if span.parent is None]
    assert (root.name, root.context.span_id) == (root_name, root_span_id)
    assert root.attributes is not None and root.attributes.get("aptix.turn_id") == turn_id
    ids = {span.context.span_id for span in spans}
    orphans = [span.name for span in spans if span.parent is not None and span.parent.span_id not in ids]
    assert not orphans, f"spans of {turn_id} whose parent is not in its trace: {orphans}"
    tasks = _task_spans(spans)
    assert all(span.attributes is not None and span.attributes.get("aptix.turn_id") == turn_id for span in tasks)
    published = [span for span in spans if span.name.startswith("apply_async/aptix.step.")]
    assert len(published) >= len(tasks), "a task whose message was not published in the turn's trace"
    assert all(span.context.trace_id == trace_id for span in spans)


def _assert_no_stray_task_span(traced: Traced) -> None:
    """Every task span the process exported, whatever its turn, is in that turn's trace."""
    tasks = _task_spans(list(traced.spans.get_finished_spans()))
    strays = [span.name for span in tasks if span.context.trace_id != _trace_of(span)]
    assert not strays


def _trace_of(task_span: ReadableSpan) -> int:
    assert task_span.attributes is not None
    return turn_ids(str(task_span.attributes["aptix.turn_id"]))[0]


def _task_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith("run/aptix.step.")]


def _reconciler(settings: Settings, *, later: timedelta) -> Reconciler:
    """A reconciler whose clock runs ``later`` ahead (every turn is past its deadline)."""
    store = RedisStateStore.from_url(settings.redis_url)
    producer = create_producer(settings)
    turns = TurnRepository(session_factory(create_db_engine(settings.database_url, pool_size=1)))
    return Reconciler(
        settings=settings,
        turns=turns,
        states=store,
        in_flight=store,
        steps=build_step_sender(CeleryBroker(producer, retry=True), store, settings),
        leader=LeaderLease(store.client, key=RECONCILER_LEADER_KEY, owner="test-reconciler"),
        ending=TurnEnding(turns=turns, cancel_flags=store, in_flight=store, metrics=WorkerMetrics(), clock=utc_now),
        broker=RedisBrokerWatch(
            redis.Redis.from_url(settings.effective_broker_url),
            store.client,
            owner="test-reconciler",
            boundaries=settings.task_boundaries,
        ),
        clock=lambda: utc_now() + later,
    )
