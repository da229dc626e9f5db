"""The gateway's read deadlines and connection caps, on a real ``aptix gateway`` process over raw sockets.

A gateway of its own runs with short deadlines (1 s for the headers, 1 s for the body, 3 s for an
upload), a long keep-alive and a cap of four connections per client address. Each test talks from a loopback
address of its own (127.0.0.x), so the per-address counts of different tests never mix. No test
measures a duration: each waits, with a generous limit, for the server to close the connection,
and checks what it answered.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from aptix_cli.launcher import ManagedProcess
from tests.conftest import KEY_A
from tests.integration.conftest import System
from tests.support.raw_http import GENEROUS, connect, get, parse, read_response, read_until_closed
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PER_CLIENT = 4
GUARDS = {
    "APTIX_HTTP_HEADER_TIMEOUT_SECONDS": "1",
    "APTIX_HTTP_BODY_TIMEOUT_SECONDS": "1",
    "APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS": "3",
    "APTIX_HTTP_KEEPALIVE_SECONDS": "60",
    "APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
}


@dataclass
class Gateway:
    """The guarded gateway process and where it listens."""

    process: ManagedProcess
    url: str
    host: str
    port: int


@pytest.fixture(scope="module")
def gateway(system: System) -> Iterator[Gateway]:
    """A gateway process with 1 s read deadlines (3 s for uploads), 60 s keep-alive and four connections per address."""
    process, url = system.stack.start_gateway(env=GUARDS)
    host, port = url.removeprefix("http://").split(":")
    yield Gateway(process, url, host, int(port))
    system.stack.stop([process])


def test_gateway_answers_408_and_closes_when_a_request_line_stops_half_way(gateway: Gateway) -> None:
    # Given a connection that sends half a request line, then nothing
    with _connect(gateway, "127.0.0.11") as sock:
        sock.sendall(b"GET /healthz HT")
        # Then the server answers 408 request_timeout and closes it
        status, body = parse(read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


def test_gateway_closes_a_new_connection_that_sends_nothing(gateway: Gateway) -> None:
    with _connect(gateway, "127.0.0.12") as sock:
        assert read_until_closed(sock) == b""


def test_gateway_answers_408_when_a_declared_body_stops_arriving(gateway: Gateway) -> None:
    # Given an authenticated POST declaring 1,000 bytes of body and sending 10
    head = (
        "POST /v1/turns HTTP/1.1\r\nHost: aptix\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY_A}\r\nContent-Length: 1000\r\n\r\n"
    )
    with _connect(gateway, "127.0.0.13") as sock:
        sock.sendall(head.encode() + b'{"input": ')
        # Then the server answers 408 request_timeout and closes it
        status, body = parse(read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    # And the app, which was waiting on that body, let go of it without an error
    assert "Traceback" not in gateway.process.log()


def test_an_upload_without_a_key_is_answered_401_and_keeps_no_connection(gateway: Gateway) -> None:
    # Given a JSON Lines upload without a key, declaring 1,000 bytes of body and sending 8
    head = "POST /v1/batches HTTP/1.1\r\nHost: aptix\r\nContent-Type: application/jsonl\r\nContent-Length: 1000\r\n\r\n"
    with _connect(gateway, "127.0.0.17") as sock:
        sock.sendall(head.encode() + b'{"input"')
        # Then it is answered 401 at once, telling the client not to reuse the connection (a pooled
        # client that did would find it half-closed: "Server disconnected without sending a response")
        answer = read_response(sock)
        status, body = parse(answer, closing=False)
        assert status == 401
        assert body["error"]["code"] == "unauthorized"
        assert b"\r\nconnection: close\r\n" in answer.partition(b"\r\n\r\n")[0].lower() + b"\r\n", answer
        # And when the client sends the rest of the body and another request on the connection, the
        # connection ends without another answer (before: the upload's 600 s deadline held it open,
        # and once the body was in, the next request was served)
        sock.sendall(b" " * 992 + get("/healthz"))
        assert read_until_closed(sock) == b""
        # And the gateway lets go of the connection: what the client sends after that is refused
        wait_for(lambda: _refuses(sock), what="the gateway to close the refused upload's connection", seconds=GENEROUS)


def test_an_authenticated_upload_has_the_upload_deadline_not_the_body_deadline(gateway: Gateway) -> None:
    # Given an authenticated JSON Lines upload declaring 1,000 bytes of body and sending 1
    head = (
        "POST /v1/batches HTTP/1.1\r\nHost: aptix\r\nContent-Type: application/jsonl\r\n"
        f"Authorization: Bearer {KEY_A}\r\nContent-Length: 1000\r\n\r\n"
    )
    with _connect(gateway, "127.0.0.18") as sock:
        sock.sendall(head.encode() + b"{")
        # Then it outlives the 1 s body deadline: the 408 that ends it is the upload's (3 s)
        status, body = parse(read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert "APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS" in body["error"]["message"], body


def test_a_kept_alive_connection_idles_past_the_header_deadline_but_a_half_sent_request_on_it_does_not(
    gateway: Gateway,
) -> None:
    # Given a connection that completed a request and now idles under the 60 s keep-alive
    with _connect(gateway, "127.0.0.14") as kept:
        kept.sendall(get("/healthz"))
        assert read_response(kept).startswith(b"HTTP/1.1 200")
        # When a connection opened after that has been closed by the header deadline
        with _connect(gateway, "127.0.0.14") as fresh:
            assert read_until_closed(fresh) == b""
        # Then the kept-alive one, idle longer than that deadline, still serves a request
        kept.sendall(get("/healthz"))
        assert read_response(kept).startswith(b"HTTP/1.1 200")
        # But a request it begins and does not finish is answered 408
        kept.sendall(b"GET /heal")
        status, body = parse(read_until_closed(kept))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


def test_connections_over_the_per_client_cap_are_refused_until_one_closes(gateway: Gateway) -> None:
    source = "127.0.0.15"
    held = [_connect(gateway, source) for _ in range(PER_CLIENT)]
    try:
        # Given as many kept-alive connections from one address as the cap allows, each having
        # served a request (an idle new connection would soon be closed by the header deadline)
        for sock in held:
            sock.sendall(get("/healthz"))
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        # When that address opens one more
        with _connect(gateway, source) as extra:
            answer = read_until_closed(extra)
        # Then it is answered 503 unavailable, with Retry-After, and closed
        status, body = parse(answer)
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
    return connect(gateway.host, gateway.port, source)


def _refuses(sock: socket.socket) -> bool:
    """Whether the server no longer takes bytes on ``sock`` (it closed the connection: a send is reset)."""
    try:
        sock.sendall(b" ")
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def _answers_ok(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.TransportError:
        return False
