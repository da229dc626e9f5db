"""What the gateway's HTTP server refuses before the app sees a request, on the real gateway over raw sockets.

A request head over 16 KiB however it arrives, lines ending in a bare LF, a request with both
``Transfer-Encoding`` and ``Content-Length`` (RFC 9112 §6.1, the request smuggling shape), and a head
h11 cannot parse: each is answered with the error envelope (431 ``request_header_fields_too_large``
or 400 ``bad_request``) and ``Connection: close``, and the connection is closed, so that nothing
sent after it on that connection is read as another request.
"""

from __future__ import annotations

import pytest

from api_gateway.server import MAX_HEAD_BYTES
from tests.integration.conftest import System
from tests.support.raw_http import connect, get, parse, read_response, read_until_closed

pytestmark = pytest.mark.integration

SOURCE = "127.0.0.31"
"""The loopback address these tests talk from (per-address connection counts of their own)."""


def _exchange(system: System, *pieces: bytes) -> bytes:
    """Send ``pieces`` one after another on one connection; everything the gateway sends until it closes it."""
    host, port = system.gateway_url.removeprefix("http://").split(":")
    with connect(host, int(port), SOURCE) as sock:
        for piece in pieces:
            sock.sendall(piece)
        return read_until_closed(sock)


def _head(size: int) -> bytes:
    """A complete ``GET /healthz`` head of exactly ``size`` bytes (one header padded to fit)."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: aptix\r\nX-Padding: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(
    "head",
    [
        _head(MAX_HEAD_BYTES + 1),
        _head(17 * 1024),
        _head(64 * 1024),
        b"GET /healthz HTTP/1.1\r\nHost: aptix\r\n" + b"".join(b"X-%d: a\r\n" % n for n in range(10_000)) + b"\r\n",
    ],
    ids=["limit+1", "17KiB", "64KiB", "10000-headers"],
)
def test_a_head_over_16_kib_sent_at_once_is_431_and_closed(system: System, head: bytes) -> None:
    status, body = parse(_exchange(system, head))
    assert status == 431
    assert body["error"]["code"] == "request_header_fields_too_large"
    assert str(MAX_HEAD_BYTES) in body["error"]["message"]


def test_a_head_over_16_kib_sent_in_pieces_is_431_with_the_error_envelope(system: System) -> None:
    head = _head(17 * 1024)
    pieces = [head[n : n + 1024] for n in range(0, len(head), 1024)]
    status, body = parse(_exchange(system, *pieces))
    assert status == 431
    assert body["error"]["code"] == "request_header_fields_too_large"


def test_a_head_of_exactly_16_kib_is_served(system: System) -> None:
    host, port = system.gateway_url.removeprefix("http://").split(":")
    with connect(host, int(port), SOURCE) as sock:
        sock.sendall(_head(MAX_HEAD_BYTES))
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\nHost: aptix\n\n",
        b"GET /healthz HTTP/1.1\r\nHost: aptix\nAccept: */*\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: aptix\r\n\n",
    ],
    ids=["every-line", "one-header", "the-empty-line"],
)
def test_a_head_with_a_bare_lf_is_400_and_closed(system: System, head: bytes) -> None:
    status, body = parse(_exchange(system, head))
    assert status == 400
    assert body["error"]["code"] == "bad_request"
    assert "bare LF" in body["error"]["message"]


def test_a_pipelined_head_with_a_bare_lf_is_refused_after_the_request_before_it_is_served(system: System) -> None:
    answer = _exchange(system, get("/healthz") + b"GET /healthz HTTP/1.1\nHost: aptix\n\n")
    first, _, rest = answer.partition(b'{"status":"ok"}')
    assert first.startswith(b"HTTP/1.1 200 "), answer
    status, body = parse(rest)
    assert (status, body["error"]["code"]) == (400, "bad_request")


def test_a_request_with_both_transfer_encoding_and_content_length_is_400_and_ends_the_connection(
    system: System,
) -> None:
    # Given a POST framed both ways, followed on the same connection by a second request: a proxy that
    # reads Content-Length and a server that reads Transfer-Encoding disagree on where it starts
    smuggled = (
        b"POST /v1/turns HTTP/1.1\r\nHost: aptix\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"
    )
    answer = _exchange(system, smuggled + get("/healthz"))
    # Then it alone is answered, 400 bad_request, and the connection is closed
    assert answer.count(b"HTTP/1.1 ") == 1, answer
    status, body = parse(answer)
    assert status == 400
    assert body["error"]["code"] == "bad_request"
    assert "Transfer-Encoding" in body["error"]["message"]


def test_a_head_h11_cannot_parse_is_400_with_the_error_envelope(system: System) -> None:
    status, body = parse(_exchange(system, b"GET /healthz HTTP/1.1\r\nHost: aptix\r\nno colon here\r\n\r\n"))
    assert status == 400
    assert body["error"]["code"] == "bad_request"
