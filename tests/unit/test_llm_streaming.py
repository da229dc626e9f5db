"""Streamed model calls: the SSE decoder, the stream reader on the scripted model's streams (always) and on
recorded OpenAI streams (when APTIX_FIXTURES_DIR is set), and ResponsesClient.stream's failure paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scripted_llm import ScriptedServer, create_app
from shared.errors import LlmError
from tests.responses_fixtures import fixtures_dir
from workers.llm import ResponsesClient, parse_response
from workers.llm.sse import SseDecoder, SseEvent
from workers.llm.streaming import ResponseStream
from workers.llm.types import LlmResponse

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather of a city", "strict": False,
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
]  # fmt: skip
SCRIPTED_TEXTS = [
    "hello there, supercalifragilistic world ✓ naïve",
    '[[call:get_weather {"city": "Paris"}]] [[call:get_weather {"city": "Lyon"}]]',
    "[[say:]]",
]


def read(body: bytes, *, chunk: int) -> tuple[LlmResponse, list[str]]:
    """Feed ``body`` to a ResponseStream ``chunk`` bytes at a time; the result and the deltas relayed."""
    deltas: list[str] = []
    reader = ResponseStream(deltas.append)
    for start in range(0, len(body), chunk):
        reader.feed(body[start : start + chunk])
    return reader.result(), deltas


# -- the SSE decoder ---------------------------------------------------------------------------------


def test_decoder_reads_events_split_anywhere_and_any_line_ending() -> None:
    body = "event: a\r\ndata: 1\r\n\r\n: keep-alive\r\rid: 7\revent: b\rdata:x\rdata:  y ✓\r\r".encode()

    for size in (1, 2, 3, 5, len(body)):
        decoder = SseDecoder()
        events = [event for start in range(0, len(body), size) for event in decoder.feed(body[start : start + size])]

        assert events == [SseEvent("a", "1"), SseEvent("b", "x\n y ✓", event_id="7")], size
        assert not decoder.partial


def test_decoder_holds_an_event_without_its_blank_line() -> None:
    decoder = SseDecoder()

    assert decoder.feed(b'data: {}\n\ndata: {"half"') == [SseEvent(None, "{}")]
    assert decoder.partial
    assert decoder.feed(b": 1}\n") == []
    assert decoder.partial
    assert decoder.feed(b"\n") == [SseEvent(None, '{"half": 1}')]
    assert not decoder.partial


# -- the stream reader on the scripted model's streams ------------------------------------------------


@pytest.fixture
def scripted() -> Iterator[TestClient]:
    with TestClient(create_app()) as client:
        yield client


@pytest.mark.parametrize("text", SCRIPTED_TEXTS)
def test_reader_returns_what_the_completed_response_parses_to(scripted: TestClient, text: str) -> None:
    request = {"model": "m", "input": text, "tools": TOOLS, "stream": True}
    body = scripted.post("/v1/responses", json=request).content
    completed = json.loads(body.rstrip().rsplit(b"\ndata: ", 1)[1])
    assert completed["type"] == "response.completed"

    for size in (1, 13, 4096):
        result, deltas = read(body, chunk=size)

        assert result == parse_response(completed["response"])
        assert "".join(deltas) == (result.output_text or "")


def test_reader_signals_the_end_of_each_text_part_after_its_deltas(scripted: TestClient) -> None:
    body = scripted.post("/v1/responses", json={"model": "m", "input": "two words", "stream": True}).content
    seen: list[str] = []
    reader = ResponseStream(seen.append, on_text_done=lambda: seen.append("<done>"))

    reader.feed(body)

    assert seen == ["Echo:", " two", " words", "<done>"]


def test_reader_uses_the_streamed_items_when_the_completed_response_has_no_output(scripted: TestClient) -> None:
    body = scripted.post("/v1/responses", json={"model": "m", "input": "hi", "stream": True}).content
    head, _, completed = body.rstrip().rpartition(b"\ndata: ")
    data = json.loads(completed)
    expected = parse_response(data["response"])
    data["response"]["output"] = []

    result, _ = read(head + b"\ndata: " + json.dumps(data).encode() + b"\n\n", chunk=4096)

    assert result == expected


@pytest.mark.parametrize(
    ("event", "code", "retryable"),
    [
        ({"type": "error", "code": "server_error", "message": "boom", "param": None}, "server_error", True),
        ({"type": "error", "error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "pay"}},
         "insufficient_quota", False),
        ({"type": "response.failed", "response": {"status": "failed", "error": {"code": "rate_limit_exceeded"}}},
         "rate_limit_exceeded", True),
        ({"type": "response.incomplete", "response": {"incomplete_details": {"reason": "max_output_tokens"}}},
         "incomplete", False),
    ],
)  # fmt: skip
def test_reader_maps_a_failure_event_like_the_same_failure_in_a_200(
    event: dict[str, Any], code: str, retryable: bool
) -> None:
    reader = ResponseStream(lambda _delta: None)

    with pytest.raises(LlmError) as caught:
        reader.feed(f"data: {json.dumps(event)}\n\n".encode())

    assert (caught.value.code, caught.value.retryable, caught.value.status_code) == (code, retryable, 0)


def test_reader_refuses_an_event_that_is_not_json() -> None:
    with pytest.raises(LlmError, match="not JSON") as caught:
        ResponseStream(lambda _delta: None).feed(b"data: {oops\n\n")

    assert caught.value.retryable is False


# -- the stream reader on recorded OpenAI streams ---------------------------------------------------


def _recorded(name: str) -> tuple[bytes, dict[str, Any] | None]:
    body = (fixtures_dir() / name).read_bytes()
    datas = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
    terminal = datas[-1]
    return body, terminal["response"] if terminal["type"] == "response.completed" else None


@pytest.mark.parametrize(
    ("name", "text", "calls"),
    [
        ("live_stream_text.sse", "The capital of PotatoLand is **Potato City**.", []),
        ("live_stream_function_call.sse", "I\u2019ll check the capital lookup tool for \u201cPotatoLand.\u201d",
         [("get_capital", {"country": "PotatoLand"})]),
        ("live_stream_parallel_calls.sse", None,
         [("secret_retrieval_tool", {"password": "mellon"}), ("secret_retrieval_tool", {"password": "radiance"})]),
        ("live_stream_2025_03_no_sequence_number.sse", None, None),
    ],
)  # fmt: skip
def test_reader_reads_recorded_streams(name: str, text: str | None, calls: list[Any] | None) -> None:
    body, completed = _recorded(name)
    assert completed is not None

    for size in (1, 100, len(body)):
        result, deltas = read(body, chunk=size)

        assert result == parse_response(completed)
        assert "".join(deltas) == (result.output_text or "")
        assert result.output_text == text
        if calls is not None:
            assert [(c.name, json.loads(c.arguments)) for c in result.function_calls] == calls


def test_reader_maps_the_recorded_quota_error_to_a_final_llm_error() -> None:
    body, _ = _recorded("live_stream_error_insufficient_quota.sse")

    with pytest.raises(LlmError) as caught:
        read(body, chunk=64)

    assert (caught.value.code, caught.value.retryable) == ("insufficient_quota", False)
    assert "exceeded your current quota" in caught.value.message


# -- ResponsesClient.stream against the scripted model on a real socket --------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[ResponsesClient]:
    llm = ResponsesClient(base_url=server.base_url, api_key="", timeout=5.0)
    yield llm
    llm.close()


@pytest.mark.parametrize("text", SCRIPTED_TEXTS)
def test_stream_returns_what_create_returns(client: ResponsesClient, server: ScriptedServer, text: str) -> None:
    request = {"model": "m", "input": text, "tools": TOOLS}
    deltas: list[str] = []

    streamed = client.stream(request, deltas.append)
    plain = client.create(request)

    assert _without_ids(streamed) == _without_ids(plain)
    assert "".join(deltas) == (plain.output_text or "")
    sent = [entry["body"] for entry in server.requests() if entry["body"]["input"] == text]
    assert [body.get("stream") for body in sent[-2:]] == [True, None]


@pytest.mark.parametrize(
    ("directive", "status", "code", "retryable", "relayed"),
    [
        ("[[fail:500]]", 500, "server_error", True, False),
        ("[[fail:429]]", 429, "rate_limit_exceeded", True, False),
        ("[[fail:400]]", 400, "invalid_request_error", False, False),
        ("[[midfail:server_error]]", 0, "server_error", True, True),
        ("[[midfail:invalid_prompt]]", 0, "invalid_prompt", False, True),
        ("[[cut:6]]", 0, None, True, True),
    ],
)
def test_stream_failures_take_the_paths_of_the_same_failures_without_streaming(
    client: ResponsesClient, directive: str, status: int, code: str | None, retryable: bool, relayed: bool
) -> None:
    deltas: list[str] = []

    with pytest.raises(LlmError) as caught:
        client.stream({"model": "m", "input": f"streamed {directive}"}, deltas.append)

    assert (caught.value.status_code, caught.value.code, caught.value.retryable) == (status, code, retryable)
    assert bool(deltas) is relayed
    if not directive.startswith("[[cut"):  # without streaming there is no connection to cut
        with pytest.raises(LlmError) as plain:
            client.create({"model": "m", "input": f"plain {directive}"})
        assert (plain.value.status_code, plain.value.code, plain.value.retryable) == (status, code, retryable)


def test_a_stream_that_stalls_past_the_read_timeout_is_a_retryable_transport_failure(server: ScriptedServer) -> None:
    llm = ResponsesClient(base_url=server.base_url, api_key="", timeout=0.3)
    try:
        with pytest.raises(LlmError, match="broke after 1 event") as caught:
            llm.stream({"model": "m", "input": "stall [[cut:2]] [[drip:1000]]"}, lambda _delta: None)
    finally:
        llm.close()

    assert (caught.value.status_code, caught.value.retryable) == (0, True)


def _without_ids(response: LlmResponse) -> tuple[Any, ...]:
    items = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in response.output_items]
    calls = [(call.name, call.arguments) for call in response.function_calls]
    return response.output_text, calls, items, response.input_tokens, response.output_tokens
