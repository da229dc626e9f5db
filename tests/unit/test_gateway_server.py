"""The gateway server's configuration and its connection counting (the deadlines are tested on a
real gateway process in tests/integration/test_gateway_timeouts.py)."""

from __future__ import annotations

from typing import Any

import h11
from starlette.types import Receive, Scope, Send

from api_gateway.server import BACKLOG, MAX_HEAD_BYTES, ConnectionLimits, GuardedH11Protocol, server_config
from api_gateway.strict_h11 import HeadTooLarge
from shared.settings import Settings


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Never called: building the configuration does not run the app."""


def _guard(**settings: Any) -> Any:
    protocol = server_config(_app, Settings(**settings), host="127.0.0.1", port=8000).http
    assert isinstance(protocol, type) and issubclass(protocol, GuardedH11Protocol)
    return protocol.guard


def test_server_config_runs_the_guarded_h11_protocol_with_the_limits_of_the_settings() -> None:
    settings = Settings(
        http_header_timeout_seconds=7,
        http_body_timeout_seconds=11,
        http_keepalive_seconds=75,
        http_max_connections=300,
        http_max_connections_per_client=9,
    )
    config = server_config(_app, settings, host="127.0.0.1", port=8000)
    assert (config.timeout_keep_alive, config.backlog) == (75, BACKLOG)
    assert config.h11_max_incomplete_event_size == MAX_HEAD_BYTES
    assert config.limit_concurrency is None  # the cap is the protocol's, at accept
    assert config.ws == "none"  # no connection leaves the guards for a WebSocket protocol
    assert isinstance(config.http, type) and issubclass(config.http, GuardedH11Protocol)
    assert config.http.guard.limits == ConnectionLimits(
        header_timeout=7, body_timeout=11, upload_timeout=600, max_connections=300, max_per_client=9
    )


def test_a_client_address_at_its_cap_is_refused_until_one_of_its_connections_closes() -> None:
    guard = _guard(http_max_connections_per_client=2)
    assert guard.accept("10.0.0.1", open_connections=1) is None
    assert guard.accept("10.0.0.1", open_connections=2) is None
    refusal = guard.accept("10.0.0.1", open_connections=3)
    assert refusal.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nretry-after: " in refusal and b'"code":"unavailable"' in refusal
    assert guard.accept("10.0.0.2", open_connections=3) is None
    guard.release("10.0.0.1")
    assert guard.accept("10.0.0.1", open_connections=3) is None


def test_without_a_per_client_cap_the_process_wide_cap_still_refuses() -> None:
    guard = _guard(http_max_connections_per_client=0, http_max_connections=3)
    assert all(guard.accept("10.0.0.1", open_connections=n) is None for n in (1, 2, 3))
    assert guard.accept("10.0.0.1", open_connections=4).startswith(b"HTTP/1.1 503 ")


def test_each_server_counts_its_own_connections() -> None:
    first, second = _guard(http_max_connections_per_client=1), _guard(http_max_connections_per_client=1)
    assert first.accept("10.0.0.1", open_connections=1) is None
    assert second.accept("10.0.0.1", open_connections=1) is None


def test_a_refused_head_is_answered_with_the_error_envelope_and_closed() -> None:
    guard = _guard()
    too_large = guard.refusal_response(HeadTooLarge(MAX_HEAD_BYTES))
    assert too_large.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b'"code":"request_header_fields_too_large"' in too_large and b"\r\nconnection: close\r\n" in too_large
    unparsable = guard.refusal_response(h11.RemoteProtocolError("illegal header line", error_status_hint=400))
    assert unparsable.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b'"code":"bad_request"' in unparsable and b"illegal header line" in unparsable


def test_h11s_own_431_for_a_long_chunk_line_is_a_400_not_a_head_too_large() -> None:
    # h11 hints 431 for any incomplete event over its limit; only a head is "request header fields too large".
    answer = _guard().refusal_response(h11.RemoteProtocolError("Receive buffer too long", error_status_hint=431))
    assert answer.startswith(b"HTTP/1.1 400 ")
