"""The scripted model's streaming mode: the events validate with the SDK's types (and validate.py when
the real-traffic fixtures are configured), deliver exactly the non-streaming answer, and break on purpose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from scripted_llm import ScriptedServer, create_app
from tests.responses_fixtures import fixtures_dir, validate_request_bodies, validate_stream_bodies
from tests.support.responses_conformance import stream_events, stream_problems

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": False,
    }
]
TWO_CALLS = '[[call:get_weather {"city": "Paris"}]] [[call:get_weather {"city": "Lyon"}]]'


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app()) as test_client:
        yield test_client


def body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "scripted", "input": [{"type": "message", "role": "user", "content": text}], **extra}


def streamed(client: TestClient, request: dict[str, Any]) -> bytes:
    answer = client.post("/v1/responses", json={**request, "stream": True})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    return answer.content


def types_of(raw: bytes) -> list[str]:
    return [data["type"] for _, data in stream_events(raw)]


def _sample_requests() -> list[dict[str, Any]]:
    """A text answer with a long word, two parallel calls, an empty text and a generation that fails."""
    return [
        body("hello there, supercalifragilistic world", instructions="be brief", tools=TOOLS),
        body(TWO_CALLS, tools=TOOLS),
        body("[[say:]]"),
        body("it breaks [[midfail:server_error]]"),
    ]


def test_every_stream_event_validates_with_the_sdk_types_and_the_stream_protocol(client: TestClient) -> None:
    streams = [streamed(client, request) for request in _sample_requests()]

    for raw in streams:
        assert stream_problems(raw) == [], raw.decode()[:2000]
    validate_request_bodies([{**request, "stream": True} for request in _sample_requests()])


def test_streams_pass_the_fixtures_validate_py(client: TestClient) -> None:
    fixtures_dir()  # skipped, saying why, when APTIX_FIXTURES_DIR is not set

    validate_stream_bodies([streamed(client, request) for request in _sample_requests()])


def test_a_text_stream_has_the_recorded_event_order(client: TestClient) -> None:
    raw = streamed(client, body("hello world"))

    assert types_of(raw) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [data["delta"] for _, data in stream_events(raw) if data["type"] == "response.output_text.delta"]
    assert deltas == ["Echo:", " hello", " world"]


def test_function_calls_stream_their_arguments_one_item_after_the_other(client: TestClient) -> None:
    events = [data for _, data in stream_events(streamed(client, body(TWO_CALLS, tools=TOOLS)))]

    added = [(e["output_index"], e["item"]["arguments"]) for e in events if e["type"] == "response.output_item.added"]
    assert added == [(0, ""), (1, "")]
    done = [(e["output_index"], e["arguments"]) for e in events if e["type"].endswith("arguments.done")]
    assert [(index, json.loads(arguments)) for index, arguments in done] == [
        (0, {"city": "Paris"}),
        (1, {"city": "Lyon"}),
    ]
    first_done = next(n for n, e in enumerate(events) if e["type"] == "response.output_item.done")
    second_added = [n for n, e in enumerate(events) if e["type"] == "response.output_item.added"][1]
    assert first_done < second_added


def test_the_completed_event_carries_the_non_streaming_answer(client: TestClient) -> None:
    for request in (body("same answer", tools=TOOLS), body(TWO_CALLS, tools=TOOLS)):
        plain = client.post("/v1/responses", json=request).json()
        final = [data for _, data in stream_events(streamed(client, request))][-1]

        assert final["type"] == "response.completed"
        ignored = {"id", "created_at", "output"}  # the ids count requests; the clock moves
        assert {k: v for k, v in final["response"].items() if k not in ignored} == {
            k: v for k, v in plain.items() if k not in ignored
        }
        assert _without_ids(final["response"]["output"]) == _without_ids(plain["output"])


def test_an_http_error_is_answered_before_any_stream(client: TestClient) -> None:
    answer = client.post("/v1/responses", json={**body("[[fail:429]]"), "stream": True})

    assert answer.status_code == 429
    assert answer.json()["error"]["code"] == "rate_limit_exceeded"


def test_midfail_sends_the_first_item_then_an_error_and_response_failed(client: TestClient) -> None:
    events = [data for _, data in stream_events(streamed(client, body("x [[midfail:server_error:1]]")))]

    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert "response.output_text.delta" in [e["type"] for e in events]
    assert events[-2]["code"] == "server_error"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "scripted failure"}
    # the count is spent: the same text now streams to the end
    assert types_of(streamed(client, body("x [[midfail:server_error:1]]")))[-1] == "response.completed"


def test_midfail_without_streaming_is_a_failed_200(client: TestClient) -> None:
    answer = client.post("/v1/responses", json=body("[[midfail:server_error]]"))

    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["error"]["code"]) == ("failed", "server_error")


def test_cut_ends_the_connection_without_a_terminal_event() -> None:
    with ScriptedServer() as server:
        request = {**body("cut me off [[cut:4:1]]"), "stream": True}
        received = bytearray()
        with pytest.raises(httpx.RemoteProtocolError), httpx.stream("POST", f"{server.base_url}/responses",
                                                                    json=request, timeout=10) as answer:  # fmt: skip
            for chunk in answer.iter_raw():
                received += chunk

        assert types_of(bytes(received)) == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        again = httpx.post(f"{server.base_url}/responses", json=request, timeout=10)
        assert not stream_problems(again.content)  # the count is spent


def test_drip_paces_the_events_without_changing_them(client: TestClient) -> None:
    assert types_of(streamed(client, body("slow [[drip:1]]"))) == types_of(streamed(client, body("slow [[drip:0]]")))


def _without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]
