"""Raw HTTP/1.1 over a socket, for tests that send what no HTTP client would (half requests, odd heads).

No helper measures a duration: each reads until the server acts, failing after :data:`GENEROUS` seconds.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

__all__ = ["GENEROUS", "connect", "get", "parse", "read_response", "read_until_closed"]

GENEROUS = 30.0
"""Seconds to wait for the server to act before the test fails (the deadlines under test are far shorter)."""


def connect(host: str, port: int, source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to ``host:port`` from the loopback address ``source`` (its per-address count of its own)."""
    return socket.create_connection((host, port), timeout=GENEROUS, source_address=(source, 0))


def get(path: str) -> bytes:
    """A complete ``GET path`` request."""
    return f"GET {path} HTTP/1.1\r\nHost: aptix\r\n\r\n".encode()


def read_until_closed(sock: socket.socket) -> bytes:
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


def read_response(sock: socket.socket) -> bytes:
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
        chunk = sock.recv(65536)
        assert chunk, f"the gateway closed the connection mid-response: {received!r}"
        body += chunk
        received += chunk
    return received


def parse(answer: bytes, *, closing: bool = True) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of one response; with ``closing``, it must say ``Connection: close``."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"not an HTTP response: {answer!r}"
    if closing:
        assert b"\r\nconnection: close" in head.lower(), f"no Connection: close in {head!r}"
    return int(head.split(b" ")[1]), json.loads(body)
