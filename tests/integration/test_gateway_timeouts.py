"""The gateway's read deadlines and connection caps, on a real ``aptix gateway`` process over raw sockets.

A gateway of its own runs with short deadlines (1 s for the headers, 1 s for the body), a long
keep-alive and a cap of four connections per client address. Each test talks from a loopback
address of its own (127.0.0.x), so the per-address counts of different tests never mix. No test
measures a duration: each waits, with a generous limit, for the server to close the connection,
and checks what it answered.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from aptix_cli.launcher import ManagedProcess
from tests.conftest import KEY_A
from tests.integration.conftest import System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PER_CLIENT = 4
GUARDS = {
    "APTIX_HTTP_HEADER_TIMEOUT_SECONDS": "1",
    "APTIX_HTTP_BODY_TIMEOUT_SECONDS": "1",
    "APTIX_HTTP_KEEPALIVE_SECONDS": "60",
    "APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
}
GENEROUS = 30.0
"""Seconds to wait for the server to act before the test fails (its deadlines are 1 s)."""


@dataclass
class Gateway:
    """The guarded gateway process and where it listens."""

    process: ManagedProcess
    url: str
    host: str
    port: int


@pytest.fixture(scope="module")
def gateway(system: System) -> Iterator[Gateway]:
    """A gateway process with 1 s read deadlines, 60 s keep-alive and four connections per address."""
    process, url = system.stack.start_gateway(env=GUARDS)
    host, port = url.removeprefix("http://").split(":")
    yield Gateway(process, url, host, int(port))
    system.stack.stop([process])


def test_gateway_answers_408_and_closes_when_a_request_line_stops_half_way(gateway: Gateway) -> None:
    # Given a connection that sends half a request line, then nothing
    with _connect(gateway, "127.0.0.11") as sock:
        sock.sendall(b"GET /healthz HT")
        # Then the server answers 408 request_timeout and closes it
        status, body = _parse(_read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


def test_gateway_closes_a_new_connection_that_sends_nothing(gateway: Gateway) -> None:
    with _connect(gateway, "127.0.0.12") as sock:
        assert _read_until_closed(sock) == b""


def test_gateway_answers_408_when_a_declared_body_stops_arriving(gateway: Gateway) -> None:
    # Given an authenticated POST declaring 1,000 bytes of body and sending 10
    head = (
        "POST /v1/turns HTTP/1.1\r\nHost: aptix\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY_A}\r\nContent-Length: 1000\r\n\r\n"
    )
    with _connect(gateway, "127.0.0.13") as sock:
        sock.sendall(head.encode() + b'{"input": ')
        # Then the server answers 408 request_timeout and closes it
        status, body = _parse(_read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    # And the app, which was waiting on that body, let go of it without an error
    assert "Traceback" not in gateway.process.log()


def test_a_kept_alive_connection_idles_past_the_header_deadline_but_a_half_sent_request_on_it_does_not(
    gateway: Gateway,
) -> None:
    # Given a connection that completed a request and now idles under the 60 s keep-alive
    with _connect(gateway, "127.0.0.14") as kept:
        kept.sendall(_get("/healthz"))
        assert _read_response(kept).startswith(b"HTTP/1.1 200")
        # When a connection opened after that has been closed by the header deadline
        with _connect(gateway, "127.0.0.14") as fresh:
            assert _read_until_closed(fresh) == b""
        # Then the kept-alive one, idle longer than that deadline, still serves a request
        kept.sendall(_get("/healthz"))
        assert _read_response(kept).startswith(b"HTTP/1.1 200")
        # But a request it begins and does not finish is answered 408
        kept.sendall(b"GET /heal")
        status, body = _parse(_read_until_closed(kept))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


def test_connections_over_the_per_client_cap_are_refused_until_one_closes(gateway: Gateway) -> None:
    source = "127.0.0.15"
    held = [_connect(gateway, source) for _ in range(PER_CLIENT)]
    try:
        # Given as many kept-alive connections from one address as the cap allows, each having
        # served a request (an idle new connection would soon be closed by the header deadline)
        for sock in held:
            sock.sendall(_get("/healthz"))
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
        # When that address opens one more
        with _connect(gateway, source) as extra:
            answer = _read_until_closed(extra)
        # Then it is answered 503 unavailable, with Retry-After, and closed
        status, body = _parse(answer)
        assert status == 503
        assert body["error"]["code"] == "unavailable"
        assert b"\r\nretry-after: " in answer.lower()
        # While another address is served
        assert httpx.get(f"{gateway.url}/healthz", timeout=GENEROUS).status_code == 200
        # And once one of its connections closes, the address is served again
        held.pop().close()
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=GENEROUS) as client:
            wait_for(
                lambda: _answers_ok(client, f"{gateway.url}/healthz"),
                what=f"{gateway.url}/healthz to answer {source} again",
                seconds=GENEROUS,
            )
    finally:
        for sock in held:
            sock.close()


def test_a_turn_runs_through_the_guarded_gateway(gateway: Gateway) -> None:
    # A long poll keeps the request open far past both deadlines: they bind the client, not the app.
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with httpx.Client(base_url=gateway.url, headers=headers, timeout=90.0) as client:
        accepted = client.post("/v1/turns", json={"input": "hello through the guarded gateway"}, params={"wait": 30})
        assert accepted.status_code == 200, accepted.text
        turn_id = accepted.json()["turn_id"]

        def finished() -> dict[str, Any] | None:
            turn: dict[str, Any] = client.get(f"/v1/turns/{turn_id}", params={"wait": 10}).json()
            return None if turn["status"] in ("queued", "running") else turn

        turn = wait_for(finished, what=f"turn {turn_id} to finish", seconds=60)
    assert turn["status"] == "completed", turn


# ----------------------------------------------------------------------------------------- helpers


def _connect(gateway: Gateway, source: str) -> socket.socket:
    return socket.create_connection((gateway.host, gateway.port), timeout=GENEROUS, source_address=(source, 0))


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: aptix\r\n\r\n".encode()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; fails if it keeps it open."""
    received = b""
    deadline = time.monotonic() + GENEROUS
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the gateway kept the connection open for {GENEROUS:g}s; it sent {received!r}")


def _read_response(sock: socket.socket) -> bytes:
    """One response on a kept-alive connection (its head and its Content-Length of body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"the gateway closed the connection mid-response: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lengths = [line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    length = int(lengths[0])
    while len(body) < length:
        body += sock.recv(65536)
    return received


def _parse(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"not an HTTP response: {answer!r}"
    assert b"\r\nconnection: close" in head.lower(), f"no Connection: close in {head!r}"
    return int(head.split(b" ")[1]), json.loads(body)


def _answers_ok(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.TransportError:
        return False
