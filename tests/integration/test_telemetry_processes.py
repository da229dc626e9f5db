"""Telemetry as deployed: ``aptix gateway`` and ``aptix worker`` (its threads and gevent processes) with
``APTIX_OTEL_ENABLED=1`` export over OTLP/HTTP, and a turn's spans from every process share its trace."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from aptix_cli.launcher import free_port, wait_until
from scripted_llm import ScriptedServer
from shared.telemetry_sdk import turn_ids
from tests.conftest import API_KEYS, redis_databases
from tests.integration.conftest import OPEN_FILE, System
from tests.support.databases import fresh_database
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


class Collector:
    """An OTLP/HTTP trace receiver: each span received, as (service, trace id, span name, parent span id)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, str, bytes]] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the name http.server calls
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["content-length"])))
                collector.add(request)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource in request.resource_spans:
                service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        trace_id = int.from_bytes(span.trace_id, "big")
                        self.spans.append((service, trace_id, span.name, span.parent_span_id))

    def of_trace(self, trace_id: int) -> list[tuple[str, int, str, bytes]]:
        with self._lock:
            return [span for span in self.spans if span[1] == trace_id]


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    receiver = Collector()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


def test_a_turn_is_one_trace_across_the_gateway_and_the_workers_processes(
    services: None, scripted_llm: ScriptedServer, modes_file: Path, collector: Collector
) -> None:
    with redis_databases(2) as (state_url, broker_url), fresh_database("aptix_otel") as database_url:
        env = {
            "APTIX_DATABASE_URL": database_url, "APTIX_REDIS_URL": state_url, "APTIX_BROKER_URL": broker_url,
            "APTIX_LLM_BASE_URL": scripted_llm.base_url,
            "APTIX_LLM_MODEL": "scripted-model", "APTIX_API_KEYS": API_KEYS, "APTIX_LLM_LOCAL_ONLY": "1",
            "APTIX_MODES_FILE": str(modes_file), "APTIX_OTEL_ENABLED": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
        }  # fmt: skip
        stack = LocalStack(env)
        try:
            # Given the gateway and a worker as deployed: `aptix worker` runs a threads and a gevent process
            worker = stack.start("worker", [sys.executable, "-m", "aptix_cli", "worker", "--hostname", "otel@%h"])
            wait_until([worker], lambda: worker.log().count("ready.") >= 2, 60)
            _, url = stack.start_gateway()
            system = System(stack=stack, gateway_url=url, llm=scripted_llm, env=env)
            # When a turn calls a server tool, pauses for a client tool and resumes
            directive = "[[call:get_current_time {}]] [[call:open_file " + json.dumps({"path": "x"}) + "]]"
            paused = system.run_turn({"input": f"{directive} m{uuid.uuid4().hex[:8]}", "tools": [OPEN_FILE]})
            assert paused["status"] == "requires_client_tools", paused
            pending = [call for call in paused["pending_tool_calls"] if call["name"] == "open_file"]
            results = [{"call_id": call["call_id"], "output": "body"} for call in pending]
            assert system.resume(paused["turn_id"], results)["status"] == "completed"
            system.http.close()
            # Then the collector receives the turn's spans from all three processes, in the turn's trace
            trace_id, root_span_id = turn_ids(paused["turn_id"])

            def arrived() -> list[tuple[str, int, str, bytes]] | None:
                # Each process exports on its own schedule: wait for the gateway's two requests as well
                # as the workers' spans, or a slow first export of the gateway's looks like a missing root.
                spans = collector.of_trace(trace_id)
                names = [span[2] for span in spans]
                both_rounds = names.count("run/aptix.step.entry") >= 2  # each makes its round's model call
                gateway = {"POST /v1/turns", "POST /v1/turns/{turn_id}/tool-results"} <= set(names)
                return spans if both_rounds and gateway else None

            spans = wait_for(arrived, what="the turn's spans at the collector")
        finally:
            stack.stop_all()
    assert {span[0] for span in spans} == {"aptix-gateway", "aptix-worker"}
    roots = [span for span in spans if not span[3]]
    assert [(span[0], span[2]) for span in roots] == [("aptix-gateway", "POST /v1/turns")]
    steps = {span[2] for span in spans if span[2].startswith("run/aptix.step.")}
    assert steps >= {"run/aptix.step.entry", "run/aptix.step.execute_server_tools"}
    assert any(span[2] == "POST /v1/turns/{turn_id}/tool-results" and span[3] == root_span_id.to_bytes(8, "big")
               for span in spans)  # fmt: skip
