"""WebhookReceiver: a small HTTP server in the test process that plays a client's webhook endpoint.

Each path answers from its own script of status codes (the last one repeats; 200 when none was set)
and keeps every request it received, headers and body as sent, for the test to check.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Received", "WebhookReceiver"]


@dataclass(frozen=True, slots=True)
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


class WebhookReceiver:
    """Serves on 127.0.0.1 on a free port until :meth:`close`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[int]] = {}
        self._received: dict[str, list[Received]] = defaultdict(list)
        receiver = self

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status = receiver._answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # the base class's name
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        """The URL of ``path`` on this receiver."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def script(self, path: str, statuses: list[int]) -> None:
        """Answer the requests to ``path`` with ``statuses`` in order, the last one from then on."""
        with self._lock:
            self._scripts[path] = list(statuses)

    def received(self, path: str) -> list[Received]:
        """The requests ``path`` got so far, oldest first."""
        with self._lock:
            return list(self._received[path])

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            script = self._scripts.get(path) or [200]
            status = script.pop(0) if len(script) > 1 else script[0]
            self._received[path].append(Received(path, headers, body, status))
            return status
