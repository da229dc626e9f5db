"""Prometheus metrics of the gateway: requests by route and status, their latency, accepted turns.

Each app gets its own registry (several apps may live in one process: tests, ``aptix dev``).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["GatewayMetrics", "install_metrics"]


class GatewayMetrics:
    """The gateway's collectors, on their own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "aptix_http_requests", "HTTP requests by route and status.", ["method", "route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "aptix_http_request_seconds", "HTTP request latency by route.", ["method", "route"], registry=self.registry
        )
        self.turns_accepted = Counter(
            "aptix_turns_accepted", "Turns accepted, by kind (single or batch).", ["kind"], registry=self.registry
        )


def install_metrics(app: FastAPI, metrics: GatewayMetrics) -> None:
    """Count every request in ``metrics`` and serve ``GET /metrics``."""
    app.add_middleware(_MetricsMiddleware, metrics=metrics)

    @app.get("/metrics", include_in_schema=False)
    async def serve_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


class _MetricsMiddleware:
    """Pure ASGI (BaseHTTPMiddleware would wrap errors raised while the body is read)."""

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = _route_template(scope)
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - started)


def _route_template(scope: Scope) -> str:
    # The path template (/v1/turns/{turn_id}), never the raw path: ids would explode the label set.
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else "unmatched"
