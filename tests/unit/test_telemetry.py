"""Tracing's cheap parts: the ids a turn's trace is derived from, and nothing loaded while it is off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shared.tracing import root_traceparent, turn_ids

REPO = Path(__file__).resolve().parents[2]
TRACING_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.instrumentation",
    "opentelemetry.exporter",
    "shared.tracing",
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


def test_nothing_of_tracing_is_imported_while_it_is_off() -> None:
    # Given a gateway app, a worker app and logging set up the way the process commands do, tracing off
    code = f"""
import json, sys
from shared.settings import Settings
from shared.logging import configure_logging
from shared.broker import send_step
from shared.models.envelope import TurnEnvelope
from shared.task_names import StepName
from api_gateway.app import create_app
from workers.app import create_celery
settings = Settings(broker_url="memory://", database_url="sqlite://")
configure_logging("INFO", log_format="json")
create_app(settings)
app = create_celery(settings)
send_step(app, TurnEnvelope(turn_id="turn_" + "0" * 31 + "1", step=StepName.REQUEST_HANDLER))
print(json.dumps({{"loaded": [m for m in sys.modules if m.startswith({TRACING_MODULES!r})]}}))
"""
    # Then none of OpenTelemetry's trace SDK, instrumentations or exporter is loaded, nor our tracing module
    assert _run(code)["loaded"] == []


def test_starting_tracing_imports_no_database_driver_before_a_worker_patches_gevent() -> None:
    # `aptix worker --pool gevent` patches before psycopg is imported (FIELD-NOTES): tracing,
    # started at worker_init, must not import psycopg on its own.
    code = """
import json, sys
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from shared.settings import Settings
from shared.telemetry import start_tracing
import api_gateway.telemetry
start_tracing(Settings(otel_enabled=True), service_name="aptix-worker", exporter=InMemorySpanExporter())
print(json.dumps({"loaded": [m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg2", "sqlalchemy")]}))
"""
    assert _run(code)["loaded"] == []
