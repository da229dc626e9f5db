"""Prometheus metrics of the gateway: requests by route and status, their latency, API key checks, accepted turns,
the turns it ends (cancels, client-tool timeouts), and each queue's backlog on the broker (what an
autoscaler scales workers on).

Each app gets its own registry (several apps may live in one process: tests, ``aptix dev``). They
are served as ``GET /metrics`` on the API port, or, with ``APTIX_METRICS_PORT`` set, on that port
only (:class:`MetricsListener`), so an Ingress publishing the API cannot publish them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Scope

from api_gateway.http_middleware import AnsweredRequestMiddleware
from shared.broker import queue_depth, unacked_depth
from shared.metrics import finished_labels, turns_finished_counter
from shared.metrics_server import MetricsServer
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo
from shared.task_names import Queue

__all__ = ["GatewayMetrics", "MetricsListener", "QueueDepthCollector", "install_metrics"]

logger = logging.getLogger(__name__)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods that get a label of their own; any other (clients may invent them) is counted as ``other``."""


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
        self.api_key_checks = Counter(
            "aptix_api_key_checks", "API key checks by outcome (api_gateway.authenticator.OUTCOMES); no key or key "
            "id is a label.", ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.turns_finished = turns_finished_counter(self.registry)
        """The turns the gateway ends: cancelled by their client, or failed ``client_tool_timeout``."""
        self.turns_finished.labels(TurnStatus.CANCELLED.value, ErrorCode.CANCELLED.value)
        self.turns_finished.labels(TurnStatus.FAILED.value, ErrorCode.CLIENT_TOOL_TIMEOUT.value)

    def count_ended(self, status: TurnStatus, error: ErrorInfo) -> None:
        """Count a turn the gateway ended (after its end was written)."""
        self.turns_finished.labels(*finished_labels(status, error)).inc()


class QueueDepthCollector(Collector):
    """``aptix_queue_depth{queue, state}``, read from a Redis broker at each scrape.

    ``state="waiting"`` counts every priority list of the queue, ``state="in_progress"`` the
    messages workers hold unacknowledged; their sum is the backlog a worker Deployment scales on.
    Every gateway replica reports the same figures: aggregate them with ``max``, not ``sum``.
    """

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge family; nothing when the broker does not answer (the scrape still succeeds)."""
        try:
            in_progress = unacked_depth(self._broker)
            waiting = {queue: queue_depth(self._broker, queue) for queue in Queue}
        except Exception:  # a broker outage must not fail the whole scrape; /readyz reports it
            logger.warning("metrics: the broker's queue depth could not be read", exc_info=True)
            return
        family = GaugeMetricFamily(
            "aptix_queue_depth", "Messages per queue: waiting (every priority) or in progress (unacked).",
            labels=["queue", "state"],
        )  # fmt: skip
        for queue in Queue:
            family.add_metric([queue.value, "waiting"], waiting[queue])
            family.add_metric([queue.value, "in_progress"], in_progress[queue])
        yield family


def install_metrics(app: FastAPI, metrics: GatewayMetrics, *, on_api_port: bool = True) -> None:
    """Count every request in ``metrics``, and serve ``GET /metrics`` on the API when ``on_api_port``.

    Without it the API has no ``/metrics`` (a 404): a :class:`MetricsListener` serves them instead.
    """
    app.add_middleware(_MetricsMiddleware, metrics=metrics)
    if not on_api_port:
        return

    @app.get("/metrics", include_in_schema=False)
    async def serve_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsListener(MetricsServer):
    """The gateway's metrics on a port of their own (``APTIX_METRICS_HOST``:``APTIX_METRICS_PORT``).

    A small HTTP server on a thread of its own, so a scrape (which reads the broker's queue depths)
    never waits on or holds the API's event loop.
    """

    def start(self) -> None:
        """Listen and serve the registry.

        Raises:
            OSError: the address cannot be bound (the port is in use, say).
        """
        super().start()
        logger.info("gateway metrics on http://%s:%d/metrics", self._host, self._port)


class _MetricsMiddleware(AnsweredRequestMiddleware):
    """Counts each HTTP request and its latency by method, route template and status."""

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        route = _route_template(scope)
        method = scope["method"] if scope["method"] in _METHODS else "other"
        self.metrics.requests.labels(method, route, str(status)).inc()
        self.metrics.latency.labels(method, route).observe(seconds)


def _route_template(scope: Scope) -> str:
    # The path template (/v1/turns/{turn_id}), never the raw path: ids would explode the label set.
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else "unmatched"
