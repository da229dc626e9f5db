"""Tests of workers.llm.client.ResponsesClient over httpx.MockTransport (no network)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from shared.errors import LlmError
from workers.llm import ResponsesClient

KEY = "sk-test-secret-key"
REQUEST = {"model": "gpt-4.1", "input": [{"type": "message", "role": "user", "content": "hi"}], "store": False}
RESPONSE = {
    "id": "resp_1",
    "status": "completed",
    "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}],
    "usage": {"input_tokens": 1, "output_tokens": 1},
}

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def make_client() -> Iterator[Callable[..., ResponsesClient]]:
    clients: list[ResponsesClient] = []

    def make(handler: Handler, *, api_key: str = KEY, base_url: str = "http://127.0.0.1:9/v1") -> ResponsesClient:
        client = ResponsesClient(base_url=base_url, api_key=api_key, transport=httpx.MockTransport(handler))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_create_posts_the_request_unchanged(make_client: Callable[..., ResponsesClient]) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=RESPONSE)

    parsed = make_client(handler, base_url="http://127.0.0.1:9/v1/").create(REQUEST)

    (request,) = seen
    assert request.method == "POST"
    assert str(request.url) == "http://127.0.0.1:9/v1/responses"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == REQUEST
    assert parsed.output_text == "hello"


def test_create_omits_authorization_when_key_is_empty(make_client: Callable[..., ResponsesClient]) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=RESPONSE)

    make_client(handler, api_key="").create(REQUEST)

    assert "authorization" not in seen[0].headers


def test_create_raises_retryable_error_on_500(make_client: Callable[..., ResponsesClient]) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        body = {"error": {"message": "The server had an error", "type": "server_error", "param": None, "code": None}}
        return httpx.Response(500, json=body, headers={"retry-after": "3"})

    with pytest.raises(LlmError) as caught:
        make_client(handler).create(REQUEST)

    assert len(calls) == 1  # no retries inside the client
    assert (caught.value.status_code, caught.value.retryable, caught.value.retry_after) == (500, True, 3.0)
    assert KEY not in str(caught.value)


def test_create_raises_non_retryable_error_on_400(make_client: Callable[..., ResponsesClient]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": "invalid_value"}}
        return httpx.Response(400, json=body)

    with pytest.raises(LlmError, match=r"answered 400 \(invalid_request_error/invalid_value\): bad") as caught:
        make_client(handler).create(REQUEST)

    assert caught.value.retryable is False


@pytest.mark.parametrize("error", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow")])
def test_create_raises_retryable_error_on_transport_failure(
    make_client: Callable[..., ResponsesClient], error: httpx.TransportError
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with pytest.raises(LlmError, match=type(error).__name__) as caught:
        make_client(handler).create(REQUEST)

    assert (caught.value.status_code, caught.value.retryable) == (0, True)
    assert KEY not in str(caught.value)


def test_create_raises_non_retryable_error_on_non_json_200(make_client: Callable[..., ResponsesClient]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>ok</html>")

    with pytest.raises(LlmError, match="not JSON") as caught:
        make_client(handler).create(REQUEST)

    assert caught.value.retryable is False


def test_create_raises_on_failed_200(make_client: Callable[..., ResponsesClient]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"id": "r", "status": "failed", "error": {"code": "server_error", "message": "m"}}
        return httpx.Response(200, json=body)

    with pytest.raises(LlmError) as caught:
        make_client(handler).create(REQUEST)

    assert caught.value.retryable is True


@pytest.mark.parametrize("url", ["https://api.openai.com/v1", "http://10.0.0.5:8900/v1", "http://example.com/v1"])
def test_local_only_guard_refuses_remote_hosts(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("APTIX_LLM_LOCAL_ONLY", "1")

    with pytest.raises(ValueError, match="APTIX_LLM_LOCAL_ONLY"):
        ResponsesClient(base_url=url, api_key=KEY)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8900/v1", "http://localhost:8900/v1", "http://[::1]:8900/v1"])
def test_local_only_guard_allows_loopback_hosts(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("APTIX_LLM_LOCAL_ONLY", "1")

    ResponsesClient(base_url=url, api_key=KEY).close()


def test_remote_hosts_allowed_without_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APTIX_LLM_LOCAL_ONLY", raising=False)

    ResponsesClient(base_url="https://api.openai.com/v1", api_key=KEY).close()
