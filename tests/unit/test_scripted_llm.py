"""Tests of the scripted Responses API server (scripted_llm): directives, journal, validity, runner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from scripted_llm import ScriptedServer, create_app
from scripted_llm import server as scripted_server
from shared.errors import LlmError
from tests.responses_fixtures import validate_request_bodies, validate_response_bodies
from tests.support.waiting import wait_for
from workers.llm import ResponsesClient, parse_response, replay_items

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": False,
    }
]


class Sleeps:
    """Stands in for the scripted server's ``asyncio.sleep``: records each latency it is asked for.

    With ``gate`` set, a sleep ends once that many are sleeping at once (or after 10 s) instead of
    after its seconds; ``most_at_once`` is how many ever were.
    """

    def __init__(self) -> None:
        self.requested: list[float] = []
        self.gate: int | None = None
        self.most_at_once = 0
        self._sleeping = 0
        self._all_in: asyncio.Event | None = None

    async def sleep(self, seconds: float) -> None:
        self.requested.append(seconds)
        if self.gate is None:
            return
        self._all_in = self._all_in or asyncio.Event()  # made on the server's event loop
        self._sleeping += 1
        self.most_at_once = max(self.most_at_once, self._sleeping)
        if self._sleeping >= self.gate:
            self._all_in.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_in.wait(), timeout=10)
        self._sleeping -= 1


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    """Patches the time (only) of ``scripted_llm.server``: its latency takes no wall-clock time."""
    fake = Sleeps()
    monkeypatch.setattr(scripted_server, "asyncio", fake)
    return fake


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app()) as test_client:
        yield test_client


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def post(client: TestClient, input_items: list[dict[str, Any]] | str, **extra: Any) -> dict[str, Any]:
    answer = client.post("/v1/responses", json={"model": "scripted", "input": input_items, **extra})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def function_calls(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(item["name"], json.loads(item["arguments"])) for item in body["output"] if item["type"] == "function_call"]


def test_answers_echo_of_last_user_text(client: TestClient) -> None:
    body = post(client, [user("first"), user("hello there")], instructions="be brief", tools=TOOLS)

    assert parse_response(body).output_text == "Echo: hello there"
    assert body["model"] == "scripted"
    assert body["instructions"] == "be brief"
    assert body["tools"] == TOOLS
    assert body["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    }


def test_reads_string_input_and_input_text_parts(client: TestClient) -> None:
    parts = {"role": "user", "content": [{"type": "input_text", "text": "a "}, {"type": "input_text", "text": "b"}]}

    assert parse_response(post(client, "plain")).output_text == "Echo: plain"
    assert parse_response(post(client, [parts])).output_text == "Echo: a b"


def test_answers_say_text_exactly(client: TestClient) -> None:
    assert parse_response(post(client, [user("x [[say:Hi, there!]] y")])).output_text == "Hi, there!"


def test_calls_one_function(client: TestClient) -> None:
    body = post(client, [user('weather? [[call:get_weather {"city": "Paris"}]]')], tools=TOOLS)

    assert function_calls(body) == [("get_weather", {"city": "Paris"})]
    item = body["output"][0]
    assert item["status"] == "completed"
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")


def test_calls_several_functions_in_order(client: TestClient) -> None:
    body = post(client, [user('[[call:get_weather {"city": "Paris"}]] and [[call:get_current_time]]')])

    assert function_calls(body) == [("get_weather", {"city": "Paris"}), ("get_current_time", {})]
    assert len({item["call_id"] for item in body["output"]}) == 2


def test_answers_tool_results_after_function_call_outputs(client: TestClient) -> None:
    # Given a response that called two functions
    question = user('[[call:get_weather {"city": "Paris"}]] [[call:get_current_time]]')
    first = post(client, [question])
    calls = parse_response(first).function_calls
    outputs = [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18C"},
        {"type": "function_call_output", "call_id": calls[1].call_id, "output": "noon"},
    ]

    # When the outputs are sent back
    second = post(client, [question, *first["output"], *outputs])

    # Then it answers in text instead of calling again
    assert parse_response(second).output_text == "Tool results: get_weather=18C; get_current_time=noon"
    assert function_calls(second) == []


def test_calls_again_for_a_new_user_message_after_outputs(client: TestClient) -> None:
    question = user("[[call:get_current_time]]")
    first = post(client, [question])
    (call,) = parse_response(first).function_calls
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "noon"}

    body = post(client, [question, *first["output"], output, user("[[call:get_weather]]")])

    assert function_calls(body) == [("get_weather", {})]


def test_loop_calls_even_after_outputs(client: TestClient) -> None:
    question = user("forever [[loop]]")
    first = post(client, [question])
    (call,) = parse_response(first).function_calls
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "noon"}

    second = post(client, [question, *first["output"], output])

    assert function_calls(first) == function_calls(second) == [("get_current_time", {})]


@pytest.mark.parametrize(
    ("status", "error_type", "code"), [(500, "server_error", "server_error"), (400, "invalid_request_error", None)]
)
def test_fail_answers_error_envelope_every_time(
    client: TestClient, status: int, error_type: str, code: str | None
) -> None:
    for _ in range(3):
        answer = client.post("/v1/responses", json={"model": "m", "input": f"[[fail:{status}]]"})
        assert answer.status_code == status
        expected = {"message": "scripted failure", "type": error_type, "param": None, "code": code}
        assert answer.json() == {"error": expected}


def test_fail_429_is_a_rate_limit_with_retry_after(client: TestClient) -> None:
    answer = client.post("/v1/responses", json={"model": "m", "input": "[[fail:429]]"})

    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "0"
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"
    assert answer.json()["error"]["type"] == "requests"


def test_retryafter_sets_the_retry_after_of_a_scripted_429(client: TestClient) -> None:
    answer = client.post("/v1/responses", json={"model": "m", "input": "[[fail:429:1]] [[retryafter:2]]"})
    again = client.post("/v1/responses", json={"model": "m", "input": "[[fail:429:1]] [[retryafter:2]]"})

    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "2"
    assert again.status_code == 200


def test_fail_with_count_fails_only_first_requests_of_that_text(client: TestClient) -> None:
    statuses = [
        client.post("/v1/responses", json={"model": "m", "input": "a [[fail:503:2]]"}).status_code for _ in range(3)
    ]
    other = client.post("/v1/responses", json={"model": "m", "input": "b [[fail:503:2]]"}).status_code

    assert statuses == [503, 503, 200]
    assert other == 503


def test_sleep_adds_latency(client: TestClient, sleeps: Sleeps) -> None:
    post(client, "[[sleep:150]]")

    assert sleeps.requested == [0.15]


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[1, 2]", b'{"input": "hi"}', b'{"model": "m"}', b'{"model": "m", "input": "[[fail:abc]]"}'],
)
def test_rejects_invalid_request_with_400_envelope(client: TestClient, content: bytes) -> None:
    answer = client.post("/v1/responses", content=content, headers={"content-type": "application/json"})

    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}


def test_accepts_path_without_v1(client: TestClient) -> None:
    answer = client.post("/responses", json={"model": "m", "input": "hi"})

    assert answer.status_code == 200
    assert parse_response(answer.json()).output_text == "Echo: hi"


def test_journal_records_and_filters_requests(client: TestClient) -> None:
    post(client, "alpha one")
    post(client, "beta two")
    client.post("/v1/responses", json={"model": "m", "input": "alpha [[fail:500]]"})

    everything = client.get("/__scripted/requests").json()["requests"]
    alphas = client.get("/__scripted/requests", params={"contains": "alpha"}).json()["requests"]

    assert [entry["body"]["input"] for entry in everything] == ["alpha one", "beta two", "alpha [[fail:500]]"]
    assert [entry["seq"] for entry in everything] == sorted(entry["seq"] for entry in everything)
    stamps = [entry["at"] for entry in everything]
    assert stamps == sorted(stamps) and abs(stamps[-1] - time.time()) < 60  # arrival times, Unix seconds
    assert [entry["body"]["input"] for entry in alphas] == ["alpha one", "alpha [[fail:500]]"]


def test_journal_is_bounded_and_can_be_cleared() -> None:
    with TestClient(create_app(journal_size=2)) as small:
        for text in ("one", "two", "three"):
            post(small, text)
        assert [e["body"]["input"] for e in small.get("/__scripted/requests").json()["requests"]] == ["two", "three"]

        assert small.delete("/__scripted/requests").status_code == 200
        assert small.get("/__scripted/requests").json() == {"requests": []}
        assert small.get("/__scripted/healthz").json() == {"ok": True}


def test_scripted_responses_validate_with_the_sdk_types(client: TestClient) -> None:
    question = user('[[call:get_weather {"city": "Paris"}]] [[call:get_current_time]]')
    first = post(client, [question], tools=TOOLS, instructions="be brief")
    outputs = [
        {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
        for call in parse_response(first).function_calls
    ]
    bodies = [
        post(client, "hi"),
        post(client, [user("[[say:done]]")]),
        first,
        post(client, [question, *first["output"], *outputs], tools=TOOLS),
        post(client, [user("[[loop]]")]),
    ]

    validate_response_bodies(bodies)


def test_composed_requests_validate_with_the_sdk_types(client: TestClient) -> None:
    # Given a request as our composer builds it, and the scripted answer calling a tool
    parameters = {"type": "object", "properties": {}}
    tools = [{"type": "function", "name": "t", "description": "d", "parameters": parameters, "strict": False}]
    composed = {"model": "m", "instructions": "x", "input": [user("hi [[call:t]]")], "tools": tools, "store": False}
    parsed = parse_response(post(client, composed["input"], tools=tools))
    (call,) = parsed.function_calls

    # When the raw output items and the cleaned replay items are sent back with the output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "result"}
    raw_replay = dict(composed, input=[*composed["input"], *parsed.output_items, output])
    clean_replay = dict(composed, input=[*composed["input"], *replay_items(parsed), output])

    # Then every request is valid
    validate_request_bodies([composed, raw_replay, clean_replay])
    assert parse_response(post(client, clean_replay["input"])).output_text == "Tool results: t=result"


def test_scripted_server_runs_twice_and_serves_the_client() -> None:
    for _ in range(2):
        with ScriptedServer() as server:
            assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
            llm = ResponsesClient(base_url=server.base_url, api_key="")
            try:
                assert llm.create({"model": "m", "input": "ping"}).output_text == "Echo: ping"
                with pytest.raises(LlmError) as caught:
                    llm.create({"model": "m", "input": "[[fail:429]]"})
            finally:
                llm.close()
            assert (caught.value.retryable, caught.value.retry_after) == (True, 0.0)
            assert [entry["body"]["input"] for entry in server.requests("ping")] == ["ping"]
            server.clear()
            assert server.requests() == []
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/__scripted/healthz", timeout=1.0)


def test_scripted_server_overlaps_concurrent_requests(sleeps: Sleeps) -> None:
    # Given a server whose every answer waits out its latency until all ten are waiting (or 10 s pass)
    sleeps.gate = 10
    with ScriptedServer(latency_ms=300) as server:
        llm = ResponsesClient(base_url=server.base_url, api_key="")
        try:
            # When ten requests come at once
            with ThreadPoolExecutor(max_workers=10) as pool:
                texts = list(pool.map(lambda i: llm.create({"model": "m", "input": f"n{i}"}).output_text, range(10)))
        finally:
            llm.close()

    # Then all ten were answered, and all ten waited out their latency at the same time
    assert texts == [f"Echo: n{i}" for i in range(10)]
    assert sleeps.requested == [0.3] * 10 and sleeps.most_at_once == 10


def test_module_entrypoint_serves_on_the_given_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "scripted_llm", "--host", "127.0.0.1", "--port", str(port), "--latency-ms", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def serving() -> bool:
        try:
            health = httpx.get(f"http://127.0.0.1:{port}/__scripted/healthz", timeout=1.0)
        except httpx.TransportError:
            assert process.poll() is None, process.communicate()[0]
            return False
        return bool(health.json() == {"ok": True})

    try:
        wait_for(serving, what="python -m scripted_llm to serve", seconds=15)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": "m", "input": "cli"}, timeout=5.0)
        assert parse_response(answer.json()).output_text == "Echo: cli"
    finally:
        process.terminate()
        process.communicate(timeout=10)
