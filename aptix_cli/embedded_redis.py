"""EmbeddedRedis: an in-process Redis (fakeredis's TCP server) for ``aptix dev`` and ``aptix demo``.

Chosen over kombu's ``memory://`` transport because it is the real thing from the code's point of
view: the same ``redis://`` URLs, the same kombu Redis transport (acks late, visibility timeout,
message priorities) and the same RedisStateStore as production, so dev mode runs the production
code paths. Why it is embedded: docs/dev.md. Nagle is switched off: with it
on, every pipelined request waited ≈ 40 ms (FIELD-NOTES).
"""

from __future__ import annotations

import select
import socketserver
import threading
from types import TracebackType

from fakeredis import TcpFakeServer
from fakeredis._clients._tcp_server import TCPFakeRequestHandler

from shared.redis_clients import redis_client

__all__ = ["EmbeddedRedis"]


class _Handler(TCPFakeRequestHandler):
    """fakeredis's handler with Nagle off, keeping the connection after an error reply.

    As shipped it closes the connection after any error (a NOSCRIPT answer to EVALSHA, say), which
    real Redis never does; kombu's Lua-script calls then lose their connection every time.
    """

    disable_nagle_algorithm = True

    def handle(self) -> None:
        while not self.server._shutdown_event.is_set():
            try:
                if self.current_client.can_read():
                    self.writer.dump(self.current_client.read_response())
                    continue
                data = self.rfile.readline()
                if data == b"":
                    readable, _, _ = select.select([self.connection], [], [], 0.01)
                    if not readable:
                        continue
                    data = self.rfile.readline()
                    if data == b"":
                        return
                self.current_client.get_socket().sendall(data)
            except ConnectionError:
                return
            except Exception as exc:  # a command error: answer it, as Redis does, and keep serving
                self.writer.dump(exc)


class _Server(TcpFakeServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, bind_and_activate=True)
        self.RequestHandlerClass = _Handler
        self.daemon_threads = True


class EmbeddedRedis:
    """A Redis server on 127.0.0.1 in a background thread (``with EmbeddedRedis() as r: r.url``)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        socketserver.TCPServer.allow_reuse_address = True
        self._server = _Server((host, port))
        host_bound, self.port = self._server.server_address[:2]
        self.host = host_bound.decode() if isinstance(host_bound, bytes) else str(host_bound)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="embedded-redis")

    def url(self, db: int = 0) -> str:
        """The ``redis://`` URL of database ``db``."""
        return f"redis://{self.host}:{self.port}/{db}"

    def start(self) -> EmbeddedRedis:
        """Serve in the background; returns once it answers PING."""
        self._thread.start()
        redis_client(self.url()).ping()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
