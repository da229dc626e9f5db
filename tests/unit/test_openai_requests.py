"""The OpenAI face's request checks: every refused field is named as OpenAI's ``param``, and input items normalise."""

from __future__ import annotations

from typing import Any

import pytest

from api_gateway.openai.errors import openai_error_body, openai_status, param_of
from api_gateway.openai.items import listed_items, model_items, user_text
from api_gateway.openai.requests import IGNORED, MODEL_OPTIONS, parse_create
from api_gateway.services.errors import InvalidRequest


def _param(body: dict[str, Any]) -> str | None:
    with pytest.raises(InvalidRequest) as refused:
        parse_create(body)
    return openai_error_body(400, refused.value.code, refused.value.message, refused.value.details)["error"]["param"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "surprise": 1}, "surprise"),
        ({}, "input"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "reasoning", "summary": []}]}, "input[1].type"),
        ({"input": [{"role": "tool", "content": "a"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": {"a": 1}}]}, "input[0].output"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "store": False, "background": True}, "store"),
        ({"input": "x", "previous_response_id": "resp_1", "conversation": "conv_1"}, "previous_response_id"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "top_p": "1"}, "top_p"),
        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata.k"),
        ({"input": "x", "background": "yes"}, "background"),
    ],
)  # fmt: skip
def test_a_refused_field_is_named_as_openais_param(body: dict[str, Any], param: str) -> None:
    assert _param(body) == param


def test_nul_anywhere_in_the_body_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        parse_create({"input": [{"role": "user", "content": "a\x00b"}]})


def test_model_options_are_kept_and_ignored_fields_dropped() -> None:
    body = {"input": "x", "temperature": 0.5, "text": {"format": {"type": "text"}}, "stream_options": {"a": 1},
            "prompt": {"id": "p"}, "mode": "general", "webhook_url": "https://h.example/x"}  # fmt: skip
    request = parse_create(body)
    assert request.model_options == {"temperature": 0.5, "text": {"format": {"type": "text"}}}
    assert (request.mode, request.webhook_url) == ("general", "https://h.example/x")
    assert not set(MODEL_OPTIONS) & set(IGNORED)


def test_the_same_body_hashes_the_same_and_another_differently() -> None:
    assert (
        parse_create({"input": "x", "metadata": {"a": "1"}}).request_hash
        == parse_create({"metadata": {"a": "1"}, "input": "x"}).request_hash
    )
    assert parse_create({"input": "x"}).request_hash != parse_create({"input": "y"}).request_hash


def test_echoed_fields_have_openais_defaults() -> None:
    echoed = parse_create({"input": "x"}).echoed("m")
    assert echoed["tool_choice"] == "auto" and echoed["parallel_tool_calls"] is True
    assert (echoed["model"], echoed["store"], echoed["background"], echoed["tools"]) == ("m", True, False, [])


def test_input_items_normalise_for_the_model_and_list_with_ids() -> None:
    items = model_items([
        {"role": "developer", "content": [{"type": "input_text", "text": "be nice"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "status": None},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "done"}]},
        {"role": "user", "content": "and now?"},
    ])  # fmt: skip

    assert items[1] == {"type": "message", "role": "assistant", "content": "hi"}
    assert items[2] == {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert items[3]["output"] == "done"
    assert user_text(items) == "and now?"
    listed = listed_items(items, prefix="abc")
    assert [item["id"] for item in listed] == ["msg_abc_0", "msg_abc_1", "fc_abc_2", "fco_abc_3", "msg_abc_4"]
    assert listed[1]["content"] == [{"type": "output_text", "text": "hi", "annotations": []}]


def test_errors_take_openais_statuses_and_params() -> None:
    assert openai_status(422, "invalid_request") == 400 and openai_status(409, "session_busy") == 409
    assert param_of(["body", "input", 2, "content", 0, "type"]) == "input[2].content[0].type"
    assert param_of(["query", "limit"]) == "limit"
    body = openai_error_body(401, "unauthorized", "no key")
    expected = {"message": "no key", "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    assert body == {"error": expected}
