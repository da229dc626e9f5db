"""Telemetry of the gateway: FastAPI's OpenTelemetry instrumentation, with a turn's requests in its trace.

``instrument_gateway`` runs only when ``APTIX_OTEL_ENABLED`` (``create_app``); OpenTelemetry is
imported then, not before. Its middleware sits outside the instrumentation's, so it acts before the
request's span starts (``shared.telemetry`` explains the design):

- ``POST /v1/turns`` reserves the new turn's id (the route records the turn under it:
  :func:`reserved_turn_id`) and the request's span becomes that turn's root span;
- ``/v1/turns/{turn_id}…`` (tool results, long-polls, cancel, trace) is made a child of the turn's
  root;
- on both, a client's own ``traceparent`` becomes a link on the request's span.

Probes and scrapes (``/healthz``, ``/readyz``, ``/metrics``) are not traced.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api_gateway.http_middleware import HttpMiddleware
from api_gateway.ids import new_turn_id

__all__ = ["instrument_gateway", "reserved_turn_id"]

_TURN_PATH = re.compile(r"^/v1/turns/(turn_[0-9a-f]{32})(?:/|$)")
_RESERVED_TURN = "aptix.reserved_turn_id"
_CLIENT_TRACEPARENT = "aptix.client_traceparent"
_TRACE_HEADERS = (b"traceparent", b"tracestate")
_NO_SPANS = "/healthz,/readyz,/metrics"


def instrument_gateway(app: FastAPI) -> None:
    """Trace every request of ``app`` (but probes), each turn's in that turn's trace.

    Call it after :func:`shared.telemetry.start_telemetry`.

    Raises:
        RuntimeError: telemetry was not started in this process.
    """
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    from shared.telemetry import active_telemetry

    telemetry = active_telemetry()
    if telemetry is None:
        raise RuntimeError("start_telemetry() first: the gateway's spans need the process's tracer provider")
    FastAPIInstrumentor.instrument_app(
        app, tracer_provider=telemetry.provider, excluded_urls=_NO_SPANS, server_request_hook=_on_request_span
    )
    instrumented = app.build_middleware_stack

    def build_middleware_stack() -> ASGIApp:
        return _TurnSpanMiddleware(instrumented())

    app.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]  # wraps the wrapper


def reserved_turn_id(request: Request) -> str | None:
    """The turn id reserved for the turn ``POST /v1/turns`` creates (None when telemetry is off)."""
    turn_id = request.scope.get(_RESERVED_TURN)
    return turn_id if isinstance(turn_id, str) else None


class _TurnSpanMiddleware(HttpMiddleware):
    """Puts each turn's requests into the turn's trace, before the request's span starts."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        from shared.telemetry_sdk import reserved_root, root_traceparent

        if scope["method"] == "POST" and scope["path"] == "/v1/turns":
            turn_id = new_turn_id()
            scope[_RESERVED_TURN] = turn_id
            _set_parent(scope, None)
            with reserved_root(turn_id):
                await self.app(scope, receive, send)
            return
        match = _TURN_PATH.match(scope["path"])
        if match is not None:
            _set_parent(scope, root_traceparent(match[1]))
        await self.app(scope, receive, send)


def _set_parent(scope: Scope, traceparent: str | None) -> None:
    """Replace the request's trace headers by ``traceparent`` (none: a root), keeping the client's for a link."""
    headers = scope.get("headers") or []
    kept = []
    for name, value in headers:
        if name == b"traceparent":
            scope[_CLIENT_TRACEPARENT] = value.decode("latin-1")
        elif name not in _TRACE_HEADERS:
            kept.append((name, value))
    if traceparent is not None:
        kept.append((b"traceparent", traceparent.encode()))
    scope["headers"] = kept


def _on_request_span(span: Any, scope: dict[str, Any]) -> None:
    """Name the turn on its requests' spans and link the client's own trace, if it sent one."""
    if not span.is_recording():
        return
    match = _TURN_PATH.match(scope.get("path", ""))
    turn_id = scope.get(_RESERVED_TURN) or (match[1] if match else None)
    if turn_id:
        span.set_attribute("aptix.turn_id", turn_id)
    client = scope.get(_CLIENT_TRACEPARENT)
    if client:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        linked = trace.get_current_span(TraceContextTextMapPropagator().extract({"traceparent": client}))
        if linked.get_span_context().is_valid:
            span.add_link(linked.get_span_context())
