"""ResponsesClient against LLMock, an independent Responses API server (real HTTP)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shared.errors import LlmError
from tests.responses_fixtures import validate_request_bodies
from workers.llm import ResponsesClient, replay_items

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": False,
    }
]


def _request(text: str) -> dict[str, Any]:
    return {
        "model": "gpt-4.1",
        "input": [{"type": "message", "role": "user", "content": text}],
        "tools": TOOLS,
        "store": False,
    }


@pytest.fixture
def client(llmock: Any) -> Iterator[ResponsesClient]:
    responses = ResponsesClient(base_url=llmock.base_url("openai"), api_key="llmock-test-key")
    yield responses
    responses.close()


def test_client_reads_text_reply(llmock: Any, client: ResponsesClient) -> None:
    llmock.reply("hello from llmock")

    parsed = client.create(_request("Say hello"))

    assert parsed.output_text == "hello from llmock"
    assert parsed.function_calls == ()
    assert parsed.response_id


def test_client_reads_tool_call_and_replay_validates(llmock: Any, client: ResponsesClient) -> None:
    llmock.call_tool("get_weather", {"city": "Paris"})
    request = _request("What is the weather in Paris?")

    parsed = client.create(request)

    (call,) = parsed.function_calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}
    validate_request_bodies([dict(request, input=[*request["input"], *replay_items(parsed), output])])


def test_client_maps_rate_limit_to_retryable_error(llmock: Any, client: ResponsesClient) -> None:
    llmock.rate_limit(retry_after=2)

    with pytest.raises(LlmError) as caught:
        client.create(_request("Hello?"))

    assert caught.value.status_code == 429
    assert caught.value.retryable is True
    assert caught.value.retry_after == 2.0
    assert len(llmock.requests) == 1
