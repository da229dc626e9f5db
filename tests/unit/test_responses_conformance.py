"""The project's own Responses API conformance check refuses what the API would refuse."""

from __future__ import annotations

import json
from typing import Any

from tests.support.responses_conformance import request_problems, response_problems, stream_problems

_TOOL = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}, "strict": False}


def _request(**extra: Any) -> dict[str, Any]:
    call = {"type": "function_call", "call_id": "c1", "name": "open_file", "arguments": "{}"}
    items = [{"role": "user", "content": "hi"}, call, {"type": "function_call_output", "call_id": "c1", "output": "x"}]
    return {"model": "gpt-4.1-mini", "input": items, "tools": [_TOOL], "store": False, **extra}


def test_a_request_aptix_composes_passes() -> None:
    assert request_problems(_request()) == []


def test_an_unknown_parameter_is_refused_where_it_is() -> None:
    assert request_problems(_request(temperatur=0.2)) == [
        "temperatur: not a field of ResponseCreateParamsNonStreaming (the API refuses unknown parameters)"
    ]
    body = _request(tools=[{**_TOOL, "strictness": True}])
    assert request_problems(body) == [
        "tools.0.strictness: not a field of FunctionToolParam (the API refuses unknown parameters)"
    ]


def test_a_coerced_type_is_refused() -> None:
    assert request_problems(_request(max_output_tokens="100")) == ["max_output_tokens: '100' is not a int"]


def test_an_output_before_its_call_is_refused() -> None:
    body = _request()
    body["input"] = [body["input"][2], body["input"][1]]
    assert request_problems(body) == ["input.0: function_call_output 'c1' answers no earlier call"]


def test_arguments_that_are_not_a_json_string_are_refused() -> None:
    body = _request()
    body["input"][1]["arguments"] = "{not json"
    assert request_problems(body) == ["input.1.arguments: not a JSON string"]


def test_a_request_without_a_model_is_refused() -> None:
    assert "model: missing (the API requires it)" in request_problems({**_request(), "model": ""})


def test_a_response_missing_its_output_is_refused() -> None:
    problems = response_problems({"id": "resp_1", "object": "response", "created_at": 1, "model": "m"})
    assert any(problem.startswith("output:") for problem in problems), problems


def test_a_streaming_request_is_walked_over_the_streaming_params() -> None:
    assert request_problems(_request(stream=True)) == []
    assert request_problems(_request(stream=False)) == []
    assert request_problems(_request(stream="yes")) == ["stream: 'yes' is not one of (False,)"]


def _sse(*events: dict[str, Any]) -> bytes:
    numbered = [{**event, "sequence_number": n} for n, event in enumerate(events)]
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in numbered)


def test_a_stream_whose_deltas_do_not_join_or_that_never_ends_is_refused() -> None:
    response = {"id": "r", "object": "response", "created_at": 1, "model": "m", "output": [], "status": "in_progress",
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    where = {"item_id": "m1", "output_index": 0, "content_index": 0, "logprobs": []}
    body = _sse(
        {"type": "response.created", "response": response},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {"id": "m1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}},
        {"type": "response.output_text.delta", **where, "delta": "Hel"},
        {"type": "response.output_text.done", **where, "text": "Hello"},
    )  # fmt: skip

    assert stream_problems(body) == [
        "the stream ends with 'response.output_text.done', not a terminal event",
        "events.3: the deltas join to 'Hel', not 'Hello'",
    ]
    assert stream_problems(body.replace(b'"sequence_number": 2', b'"sequence_number": 5'))[0] == (
        "events.2 (response.output_text.delta): sequence_number 5, expected 2"
    )
