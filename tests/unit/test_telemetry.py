"""Telemetry's cheap parts: the ids a turn's trace is derived from, and nothing loaded while it is off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.broker import create_producer
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.state import MemoryStateStore
from shared.step_sender import CeleryBroker, StepSender
from shared.task_names import StepName
from shared.telemetry import start_telemetry, stop_telemetry
from shared.telemetry_sdk import _adopt_turn_spans, root_traceparent, turn_ids

REPO = Path(__file__).resolve().parents[2]
TURN = "turn_0af7651916cd43dd8448eb211c80319c"
TELEMETRY_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.instrumentation",
    "opentelemetry.exporter",
    "shared.telemetry_sdk",
)


def test_a_turn_id_is_its_trace_id_and_its_low_half_the_root_span_id() -> None:
    trace_id, span_id = turn_ids("turn_0af7651916cd43dd8448eb211c80319c")
    assert f"{trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{span_id:016x}" == "8448eb211c80319c"
    assert root_traceparent("turn_0af7651916cd43dd8448eb211c80319c") == (
        "00-0af7651916cd43dd8448eb211c80319c-8448eb211c80319c-01"
    )


def test_an_id_of_another_shape_is_hashed_the_same_way_every_time() -> None:
    assert turn_ids("t-1") == turn_ids("t-1") != turn_ids("t-2")
    assert all(part != 0 for part in turn_ids("t-1"))


def _run(code: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_nothing_of_telemetry_is_imported_while_it_is_off() -> None:
    # Given a gateway app, a worker app and logging set up the way the process commands do, telemetry off
    code = f"""
import json, sys
from shared.settings import Settings
from shared.logging import configure_logging
from shared.models.envelope import TurnEnvelope
from shared.state import MemoryStateStore
from shared.step_sender import CeleryBroker, StepSender
from shared.task_names import StepName
from api_gateway.app import create_app
from workers.app import create_celery
settings = Settings(broker_url="memory://", database_url="sqlite://")
configure_logging("INFO", log_format="json")
create_app(settings)
app = create_celery(settings)
steps = StepSender(CeleryBroker(app, retry=False), timers=MemoryStateStore(), park_after=30)
steps.send([TurnEnvelope(turn_id="turn_" + "0" * 31 + "1", step=StepName.REQUEST_HANDLER)])
print(json.dumps({{"loaded": [m for m in sys.modules if m.startswith({TELEMETRY_MODULES!r})]}}))
"""
    # Then none of OpenTelemetry's trace SDK, instrumentations or exporter is loaded, nor our telemetry module
    assert _run(code)["loaded"] == []


def test_starting_telemetry_imports_no_database_driver_before_a_worker_patches_gevent() -> None:
    # `aptix worker --pool gevent` patches before psycopg is imported (FIELD-NOTES): telemetry,
    # started at worker_init, must not import psycopg on its own.
    code = """
import json, sys
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared.settings import Settings
from shared.telemetry import start_telemetry
import api_gateway.telemetry
start_telemetry(Settings(otel_enabled=True), service_name="aptix-worker", exporter=InMemorySpanExporter())
print(json.dumps({"loaded": [m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg2", "sqlalchemy")]}))
"""
    assert _run(code)["loaded"] == []


def test_a_message_sent_outside_any_trace_goes_out_under_its_turns_root() -> None:
    # Given telemetry on, and no span current (a reconciler thread releasing a parked retry, say)
    exporter = InMemorySpanExporter()
    settings = Settings(broker_url="memory://", otel_enabled=True)
    start_telemetry(settings, service_name="aptix-test", exporter=exporter)
    try:
        # When a step is sent
        producer = create_producer(settings)
        steps = StepSender(CeleryBroker(producer, retry=False), timers=MemoryStateStore(), park_after=30)
        steps.send([TurnEnvelope(turn_id=TURN, step=StepName.REASONER, hop=4)])
    finally:
        stop_telemetry()
    # Then its publish span is a child of the turn's root, in the turn's trace
    (published,) = exporter.get_finished_spans()
    trace_id, root_span_id = turn_ids(TURN)
    assert published.name == "apply_async/aptix.step.reasoner"
    assert published.context.trace_id == trace_id
    assert published.parent is not None and published.parent.span_id == root_span_id


def test_a_step_message_without_trace_headers_runs_under_its_turns_root() -> None:
    # A sender with telemetry off sends no traceparent; the task span's parent is then the turn's root
    task = SimpleNamespace(name="aptix.step.llm_call", request=SimpleNamespace())
    _adopt_turn_spans(task=task, args=[{"turn_id": TURN, "step": "llm_call"}])
    assert task.request.traceparent == root_traceparent(TURN)
    # and a message that carries one keeps it
    carried = SimpleNamespace(name="aptix.step.llm_call", request=SimpleNamespace(traceparent="00-ab-cd-01"))
    _adopt_turn_spans(task=carried, args=[{"turn_id": TURN, "step": "llm_call"}])
    assert carried.request.traceparent == "00-ab-cd-01"
