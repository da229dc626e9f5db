"""The gateway server's configuration and its connection counting (the deadlines are tested on a
real gateway process in tests/integration/test_gateway_timeouts.py)."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

from api_gateway.server import BACKLOG, MAX_HEAD_BYTES, ConnectionLimits, GuardedH11Protocol, server_config
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
