"""MetricsServer: a Prometheus registry served over HTTP on a thread of its own, started and stopped.

The gateway's metrics port and each ``aptix worker``'s listener both serve one registry this way, so a
scrape never waits on (or holds) the process's own work.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["MetricsServer"]


class MetricsServer:
    """Serves ``registry`` on ``host``:``port`` (``/metrics``) between :meth:`start` and :meth:`stop`."""

    def __init__(self, registry: CollectorRegistry, *, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen and serve the registry.

        Raises:
            OSError: the address cannot be bound (the port is in use, say).
        """
        self._server, self._thread = start_http_server(self._port, addr=self._host, registry=self._registry)

    def stop(self) -> None:
        """Stop listening (and wait for the serving thread)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
