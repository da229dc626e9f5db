"""Tests of workers.llm.client.ResponsesClient against a tiny HTTP/1.1 server on a real local socket."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: bytes
    client_port: int
    """The client's source port: one per TCP connection."""


@dataclass
class Reply:
    """What the server does with one request."""

    status: int = 200
    body: bytes | dict[str, Any] = field(default_factory=lambda: RESPONSE)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    hold: threading.Event | None = None
    """Answer only once this is set (or after 10 s)."""
    drop: bool = False
    """Close the connection without answering."""
    close_after: bool = False
    """Answer as if keeping the connection alive, then close it (an idle keep-alive timeout)."""


Handler = Callable[[Seen], Reply]


class FakeLlm:
    """A threaded HTTP/1.1 server; each test sets ``handler`` (default: 200 with RESPONSE)."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.handler: Handler = lambda _seen: Reply()
        self.connection_closed = threading.Event()
        fake = self

        class _RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                seen = Seen(
                    self.command,
                    self.path,
                    {name.lower(): value for name, value in self.headers.items()},
                    body,
                    self.client_address[1],
                )
                fake.seen.append(seen)
                reply = fake.handler(seen)
                time.sleep(reply.delay_s)
                if reply.hold is not None:
                    reply.hold.wait(10)
                if reply.drop:
                    self.close_connection = True
                    return
                raw = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                if reply.close_after:
                    self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class _Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (read timeout) makes the late answer fail: expected

            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)  # the socket is closed here, after the handler's finish()
                fake.connection_closed.set()

        self._server = _Server(("127.0.0.1", 0), _RequestHandler)
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def llm() -> Iterator[FakeLlm]:
    server = FakeLlm()
    yield server
    server.close()


@pytest.fixture
def make_client(llm: FakeLlm) -> Iterator[Callable[..., ResponsesClient]]:
    clients: list[ResponsesClient] = []

    def make(*, api_key: str = KEY, base_url: str | None = None, **kwargs: Any) -> ResponsesClient:
        client = ResponsesClient(base_url=base_url or llm.base_url, api_key=api_key, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def test_create_posts_the_request_unchanged(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    parsed = make_client(base_url=llm.base_url + "/").create(REQUEST)

    (request,) = llm.seen
    assert request.method == "POST"
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body) == REQUEST
    assert parsed.output_text == "hello"


def test_create_sends_non_ascii_text_as_utf8(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    request = {**REQUEST, "input": "héllo ✓"}

    make_client().create(request)

    assert json.loads(llm.seen[0].body.decode("utf-8")) == request


def test_create_omits_authorization_when_key_is_empty(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    make_client(api_key="").create(REQUEST)

    assert "authorization" not in llm.seen[0].headers


def test_create_raises_retryable_error_on_500(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    body = {"error": {"message": "The server had an error", "type": "server_error", "param": None, "code": None}}
    llm.handler = lambda _seen: Reply(500, body, headers={"Retry-After": "3"})

    with pytest.raises(LlmError) as caught:
        make_client().create(REQUEST)

    assert len(llm.seen) == 1  # no retries inside the client
    assert (caught.value.status_code, caught.value.retryable, caught.value.retry_after) == (500, True, 3.0)
    assert KEY not in str(caught.value)


def test_create_reads_retry_after_ms_on_429(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    body = {"error": {"message": "slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    llm.handler = lambda _seen: Reply(429, body, headers={"Retry-After-Ms": "1500", "retry-after": "9"})

    with pytest.raises(LlmError) as caught:
        make_client().create(REQUEST)

    assert (caught.value.status_code, caught.value.retryable, caught.value.retry_after) == (429, True, 1.5)


def test_create_raises_non_retryable_error_on_400(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    body = {"error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": "invalid_value"}}
    llm.handler = lambda _seen: Reply(400, body)

    with pytest.raises(LlmError, match=r"answered 400 \(invalid_request_error/invalid_value\): bad") as caught:
        make_client().create(REQUEST)

    assert caught.value.retryable is False


def test_an_error_message_that_echoes_the_key_is_redacted(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    # Given a provider that echoes the key it received, and names another OpenAI-style key
    echo = {
        "error": {
            "type": "invalid_request_error",
            "code": "invalid_api_key",
            "message": f"Incorrect API key provided: {KEY}. Old key sk-proj-abcdef123456 revoked.",
        }
    }
    llm.handler = lambda _seen: Reply(401, echo)  # fmt: skip

    with pytest.raises(LlmError) as caught:
        make_client().create(REQUEST)

    # Then neither key is in the error the turn records
    assert KEY not in caught.value.message and "sk-proj-abcdef123456" not in caught.value.message
    assert caught.value.message.count("[REDACTED]") == 2, caught.value.message
    assert "Incorrect API key provided" in caught.value.message


def test_create_does_not_follow_redirects(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    llm.handler = lambda _seen: Reply(307, b"", headers={"Location": f"{llm.base_url}/elsewhere"})

    with pytest.raises(LlmError) as caught:
        make_client().create(REQUEST)

    assert len(llm.seen) == 1
    assert (caught.value.status_code, caught.value.retryable) == (307, False)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # nothing listens there now: connecting is refused


@pytest.mark.parametrize("failure", ["refused", "read_timeout", "dropped"])
def test_create_raises_retryable_error_on_transport_failure(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient], failure: str
) -> None:
    base_url = f"http://127.0.0.1:{_closed_port()}/v1" if failure == "refused" else None
    answer = threading.Event()  # held until the call is over: only the client's own timeout can end it
    llm.handler = lambda _seen: Reply(hold=answer) if failure == "read_timeout" else Reply(drop=True)

    with pytest.raises(LlmError, match="failed before an answer") as caught:
        make_client(base_url=base_url, timeout=0.3).create(REQUEST)
    answer.set()

    assert (caught.value.status_code, caught.value.retryable) == (0, True)
    assert KEY not in str(caught.value)
    assert len(llm.seen) == (0 if failure == "refused" else 1)  # no retries inside the client


def test_create_raises_non_retryable_error_on_non_json_200(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    llm.handler = lambda _seen: Reply(200, b"<html>ok</html>", headers={"Content-Type": "text/html"})

    with pytest.raises(LlmError, match="not JSON") as caught:
        make_client().create(REQUEST)

    assert caught.value.retryable is False


def test_create_raises_on_failed_200(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    llm.handler = lambda _seen: Reply(200, {"id": "r", "status": "failed", "error": {"code": "server_error"}})

    with pytest.raises(LlmError) as caught:
        make_client().create(REQUEST)

    assert caught.value.retryable is True


def test_calls_reuse_one_connection(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    client = make_client()

    client.create(REQUEST)
    client.create(REQUEST)

    assert len({seen.client_port for seen in llm.seen}) == 1


def test_a_connection_the_server_closed_while_idle_is_replaced(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    client = make_client()
    llm.handler = lambda _seen: Reply(close_after=True)
    client.create(REQUEST)
    assert llm.connection_closed.wait(5)  # the server closed the kept-alive connection

    llm.handler = lambda _seen: Reply()
    assert client.create(REQUEST).output_text == "hello"

    assert len({seen.client_port for seen in llm.seen}) == 2


def test_max_connections_bounds_the_open_connections(llm: FakeLlm, make_client: Callable[..., ResponsesClient]) -> None:
    client = make_client(max_connections=2)
    llm.handler = lambda _seen: Reply(delay_s=0.2)
    results: list[str | None] = []

    def call() -> None:
        results.append(client.create(REQUEST).output_text)

    callers = [threading.Thread(target=call) for _ in range(6)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)

    assert results == ["hello"] * 6  # the extra callers waited for a free connection
    assert len({seen.client_port for seen in llm.seen}) <= 2


def test_max_connections_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        ResponsesClient(base_url="http://127.0.0.1:9/v1", api_key=KEY, max_connections=0)


def test_proxy_from_the_environment_is_used(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("APTIX_LLM_LOCAL_ONLY", raising=False)
    for name in ("HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{llm.port}")

    make_client(base_url="http://llm.example.invalid/v1").create(REQUEST)

    assert llm.seen[0].path == "http://llm.example.invalid/v1/responses"  # the absolute form: via the proxy


def test_no_proxy_bypasses_the_proxy(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("no_proxy", "127.0.0.1")

    make_client().create(REQUEST)

    assert llm.seen[0].path == "/v1/responses"


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


def _sse_body(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)


_TEXT_EVENTS = (
    {"type": "response.created", "response": {**RESPONSE, "status": "in_progress", "output": []}},
    {"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0, "delta": "hel"},
    {"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0, "delta": "lo"},
    {"type": "response.completed", "response": RESPONSE},
)


def test_stream_sends_stream_true_and_relays_each_delta(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    # Given a server that answers with an event stream of known length (not chunked)
    llm.handler = lambda _seen: Reply(body=_sse_body(*_TEXT_EVENTS), headers={"Content-Type": "text/event-stream"})
    client = make_client()
    deltas: list[str] = []

    # When the client streams twice
    first = client.stream(REQUEST, deltas.append)
    second = client.stream(REQUEST, deltas.append)

    # Then it asked to stream, relayed the deltas, returned what create() returns, on one connection
    assert json.loads(llm.seen[0].body) == {**REQUEST, "stream": True}
    assert deltas == ["hel", "lo", "hel", "lo"]
    llm.handler = lambda _seen: Reply()
    assert first == second == client.create(REQUEST)
    assert len({seen.client_port for seen in llm.seen}) == 1


def test_stream_reads_a_json_answer_when_the_server_does_not_stream(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    deltas: list[str] = []

    parsed = make_client().stream(REQUEST, deltas.append)

    assert (parsed.output_text, deltas) == ("hello", [])


def test_stream_raises_an_error_answer_before_relaying_anything(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    body = {"error": {"message": "slow down", "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    llm.handler = lambda _seen: Reply(429, body, headers={"Retry-After": "2"})
    deltas: list[str] = []

    with pytest.raises(LlmError) as caught:
        make_client().stream(REQUEST, deltas.append)

    assert (caught.value.status_code, caught.value.retryable, caught.value.retry_after) == (429, True, 2.0)
    assert deltas == []


def test_stream_that_ends_without_its_terminal_event_is_a_retryable_transport_failure(
    llm: FakeLlm, make_client: Callable[..., ResponsesClient]
) -> None:
    llm.handler = lambda _seen: Reply(body=_sse_body(*_TEXT_EVENTS[:2]), headers={"Content-Type": "text/event-stream"})
    deltas: list[str] = []

    with pytest.raises(LlmError, match=r"ended before its response\.completed") as caught:
        make_client().stream(REQUEST, deltas.append)

    assert (caught.value.status_code, caught.value.retryable, deltas) == (0, True, ["hel"])
