"""Tests of workers.llm.parsing against the recorded real Responses API fixtures."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from shared.errors import LlmError
from tests.responses_fixtures import fixtures_dir, load_fixture, validate_request_bodies
from workers.llm.parsing import parse_error, parse_response, replay_items

# file -> (text start or None, [(name, arguments)], item types, input_tokens, output_tokens)
EXPECTED: dict[str, tuple[str | None, list[tuple[str, str]], list[str], int, int]] = {
    "spec_functions_response.json": (
        None,
        [("get_current_weather", '{"location":"Boston, MA","unit":"celsius"}')],
        ["function_call"],
        291,
        23,
    ),
    "spec_text_input_response.json": ("In a peaceful grove beneath a silver moon", [], ["message"], 36, 87),
    "spec_reasoning_response.json": ("The classic tongue twister...", [], ["message"], 81, 1035),
    "sdk_snapshot_output_text_response.json": ("I can't provide real-time updates", [], ["message"], 14, 50),
    "live_single_call_turn1_response.json": (
        None,
        [("get_capital", '{"country":"PotatoLand"}')],
        ["function_call"],
        40,
        18,
    ),
    "live_single_call_turn2_response.json": ("The capital of PotatoLand is Potato City.", [], ["message"], 67, 11),
    "live_parallel_calls_turn1_response.json": (
        None,
        [("get_location", '{"loc_name":"Londos"}'), ("get_location", '{"loc_name":"London"}')],
        ["function_call", "function_call"],
        0,
        0,
    ),
    "live_parallel_calls_turn2_response.json": ('It seems "Londos" might be incorrect', [], ["message"], 335, 44),
    "live_prev_response_id_followup_response.json": (
        "The weather in New York is sunny and 72°F.",
        [],
        ["message"],
        139,
        14,
    ),
    "live_reasoning_phase_call_turn1_response.json": (
        'I\'ll check the capital lookup tool for "PotatoLand."',
        [("get_capital", '{"country":"PotatoLand"}')],
        ["reasoning", "message", "function_call"],
        63,
        72,
    ),
    "live_reasoning_phase_call_turn2_response.json": (
        "The capital of PotatoLand is **Potato City**.",
        [],
        ["message"],
        150,
        16,
    ),
}


def test_expectations_cover_every_recorded_response() -> None:
    recorded = {path.name for path in fixtures_dir().glob("*_response.json")}
    assert recorded == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_response_reads_recorded_response(name: str) -> None:
    body = load_fixture(name)
    text_start, calls, item_types, input_tokens, output_tokens = EXPECTED[name]

    parsed = parse_response(body)

    assert parsed.response_id == body["id"]
    if text_start is None:
        assert parsed.output_text is None
    else:
        assert parsed.output_text is not None and parsed.output_text.startswith(text_start)
    assert [(call.name, call.arguments) for call in parsed.function_calls] == calls
    assert [item["type"] for item in parsed.output_items] == item_types
    assert list(parsed.output_items) == body["output"]
    assert (parsed.input_tokens, parsed.output_tokens) == (input_tokens, output_tokens)


def test_parse_response_keeps_call_and_item_ids() -> None:
    parsed = parse_response(load_fixture("live_single_call_turn1_response.json"))

    (call,) = parsed.function_calls
    assert call.call_id == "call_YfwRsW8sUxDKipwyhWTzOXCA"
    assert call.item_id == "fc_04907f5d3de791830068fbaa1b310c81958dc9c508e878c632"


def test_parse_response_reads_parallel_calls_from_docs_output_items() -> None:
    items = load_fixture("docs_function_calling_multiple_calls_output_items.json")

    parsed = parse_response({"id": "x", "output": items})

    assert [(c.call_id, c.name) for c in parsed.function_calls] == [
        ("call_12345xyz", "get_weather"),
        ("call_67890abc", "get_weather"),
        ("call_99999def", "send_email"),
    ]
    assert json.loads(parsed.function_calls[1].arguments) == {"location": "Bogotá, Colombia"}
    assert parsed.output_text is None
    assert (parsed.input_tokens, parsed.output_tokens) == (0, 0)


def test_parse_response_ignores_reasoning_text() -> None:
    body = {
        "id": "r",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        ],
    }

    assert parse_response(body).output_text == "ab"


def test_parse_response_tolerates_missing_usage_details() -> None:
    body = {"id": "r", "output": [], "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}}

    parsed = parse_response(body)

    assert (parsed.input_tokens, parsed.output_tokens, parsed.output_text) == (3, 4, None)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ([], "not a JSON object"),
        ("text", "not a JSON object"),
        ({"id": "r"}, "no 'output' list"),
        ({"id": "r", "output": {"type": "message"}}, "no 'output' list"),
        ({"id": "r", "output": ["x"]}, "not an object"),
    ],
)
def test_parse_response_rejects_unusable_body(body: Any, fragment: str) -> None:
    with pytest.raises(LlmError, match=fragment) as caught:
        parse_response(body)
    assert caught.value.retryable is False


def test_parse_response_rejects_broken_function_call() -> None:
    body = load_fixture("broken/broken_response_function_call.json")

    with pytest.raises(LlmError, match="call_id"):
        parse_response(body)


def test_parse_response_rejects_object_arguments() -> None:
    body = load_fixture("broken/broken_response_function_call.json")
    body["output"] = [dict(body["output"][0], call_id="call_1")]

    with pytest.raises(LlmError, match="expected a JSON string"):
        parse_response(body)


@pytest.mark.parametrize(
    ("code", "retryable"), [("server_error", True), ("rate_limit_exceeded", True), ("invalid_prompt", False)]
)
def test_parse_response_maps_failed_status(code: str, retryable: bool) -> None:
    body = {"id": "r", "status": "failed", "error": {"code": code, "message": "went wrong"}, "output": []}

    with pytest.raises(LlmError, match="went wrong") as caught:
        parse_response(body)

    assert (caught.value.code, caught.value.retryable) == (code, retryable)


def test_parse_response_maps_incomplete_status() -> None:
    body = {"id": "r", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []}

    with pytest.raises(LlmError, match="max_output_tokens") as caught:
        parse_response(body)

    assert caught.value.retryable is False


def test_parse_error_maps_invalid_param_400() -> None:
    body = (fixtures_dir() / "live_error_400_invalid_param.json").read_bytes()

    error = parse_error(400, body, {})

    assert error.retryable is False
    assert error.status_code == 400
    assert error.code == "decimal_below_min_value"
    assert error.message.startswith(
        "LLM server answered 400 (invalid_request_error/decimal_below_min_value): Invalid 'temperature'"
    )


def test_parse_error_maps_400_without_code() -> None:
    body = (fixtures_dir() / "live_error_400_reasoning_item_order.json").read_text(encoding="utf-8")

    error = parse_error(400, body, {})

    assert error.retryable is False
    assert error.message.startswith("LLM server answered 400 (invalid_request_error): Item 'rs_")


def test_parse_error_maps_rate_limit_429_as_retryable() -> None:
    body = (fixtures_dir() / "error_429_rate_limit_transcribed.json").read_bytes()

    error = parse_error(429, body, {"retry-after": "2"})

    assert error.retryable is True
    assert error.code == "rate_limit_exceeded"
    assert error.retry_after == 2.0
    assert "Please try again in 1.574s" in error.message


@pytest.mark.parametrize("field", ["code", "type"])
def test_parse_error_does_not_retry_insufficient_quota(field: str) -> None:
    envelope = {"message": "You exceeded your current quota", "type": "requests", "param": None, "code": None}
    envelope[field] = "insufficient_quota"

    error = parse_error(429, json.dumps({"error": envelope}), {})

    assert error.retryable is False
    assert error.code == "insufficient_quota"


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (409, True),
        (422, False),
        (500, True),
        (502, True),
        (503, True),
    ],
)
def test_parse_error_retries_by_status(status: int, retryable: bool) -> None:
    body = {"error": {"message": "m", "type": "t", "param": None, "code": None}}

    assert parse_error(status, json.dumps(body), {}).retryable is retryable


def test_parse_error_prefers_retry_after_ms() -> None:
    headers = {"Retry-After-Ms": "1500", "Retry-After": "7"}

    assert parse_error(429, b"{}", headers).retry_after == 1.5


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        ({}, None),
    ],
)
def test_parse_error_reads_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_error(503, b"", headers).retry_after == expected


def test_parse_error_bounds_long_and_non_json_messages() -> None:
    error = parse_error(502, "<html>" + "x" * 5000 + "</html>", {})

    assert error.retryable is True
    assert error.message.startswith("LLM server answered 502: <html>xxx")
    assert len(error.message) < 600


def test_replay_items_cleans_function_calls_for_the_next_request() -> None:
    # Given a function_call item as LLMock-like servers may send it (null status, an extra key)
    parsed = parse_response(load_fixture("live_reasoning_phase_call_turn1_response.json"))
    items = [copy.deepcopy(item) for item in parsed.output_items]
    items[2]["status"] = None
    items[2]["namespace"] = None
    items[2]["extra"] = "dropped"
    dirty = parse_response({"id": "r", "output": items})

    # When it is cleaned for replay
    replayed = replay_items(dirty)

    # Then the next request composed from it validates
    assert replayed[2] == {
        "type": "function_call",
        "id": "fc_094ebefab06f6c100069efd5833ce081959f3a131863e89e53",
        "call_id": "call_ALAJMWK9buNN7RXxxXbECcHa",
        "name": "get_capital",
        "arguments": '{"country":"PotatoLand"}',
    }
    request = {
        "model": "gpt-5.5",
        "store": False,
        "input": [
            {"type": "message", "role": "user", "content": "What is the capital of PotatoLand?"},
            *replayed,
            {"type": "function_call_output", "call_id": "call_ALAJMWK9buNN7RXxxXbECcHa", "output": "Potato City"},
        ],
    }
    validate_request_bodies([request])


def test_replay_items_of_every_recorded_response_validate() -> None:
    requests = []
    for name in sorted(EXPECTED):
        parsed = parse_response(load_fixture(name))
        outputs = [
            {"type": "function_call_output", "call_id": call.call_id, "output": "ok"} for call in parsed.function_calls
        ]
        requests.append(
            {
                "model": "m",
                "store": False,
                "input": [{"type": "message", "role": "user", "content": "hi"}, *replay_items(parsed), *outputs],
            }
        )

    validate_request_bodies(requests)
