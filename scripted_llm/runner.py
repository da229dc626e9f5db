"""ScriptedServer: the scripted model on a real socket, in a background thread (tests, demo)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import httpx
import uvicorn

from scripted_llm.server import create_app

__all__ = ["ScriptedServer"]

_STARTUP_TIMEOUT_S = 10.0


class ScriptedServer:
    """Run the scripted model with uvicorn in a daemon thread, as a context manager.

    ``with ScriptedServer() as llm: client = ResponsesClient(base_url=llm.base_url, api_key="")``
    """

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, latency_ms: float = 0.0, journal_size: int = 2000
    ) -> None:
        """Prepare the server; :meth:`start` (or ``with``) runs it.

        Args:
            host: the address to bind.
            port: the port to bind; 0 picks a free one.
            latency_ms: latency added to every answer.
            journal_size: how many request bodies the journal keeps.
        """
        self._host = host
        self._port = port
        self._app = create_app(latency_ms=latency_ms, journal_size=journal_size)
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:8900``."""
        return f"http://{self._host}:{self._port}"

    @property
    def base_url(self) -> str:
        """The Responses API base URL to give a client: ``{url}/v1``."""
        return f"{self.url}/v1"

    @property
    def port(self) -> int:
        """The bound port (known once started when created with port 0)."""
        return self._port

    def start(self) -> ScriptedServer:
        """Bind, start uvicorn and wait until ``/__scripted/healthz`` answers.

        Returns:
            self.

        Raises:
            RuntimeError: already running, or the server thread died during start-up.
            TimeoutError: the server did not answer in time.
        """
        if self._thread is not None:
            raise RuntimeError("ScriptedServer is already running")
        # Bind before uvicorn starts, so port 0 resolves now and no other process can take it.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._socket = sock
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"scripted-llm-{self._port}", daemon=True
        )
        self._thread.start()
        self._wait_healthy()
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit, join its thread and close the socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=_STARTUP_TIMEOUT_S)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout=_STARTUP_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def requests(self, contains: str | None = None) -> list[dict[str, Any]]:
        """The journal: ``[{"seq", "at", "body"}]`` of received requests whose JSON contains ``contains``
        (``at``: when it arrived, Unix time).

        Args:
            contains: a substring of the request JSON; all requests when None.

        Returns:
            The matching journal entries, oldest first.
        """
        params = {"contains": contains} if contains is not None else {}
        answer = httpx.get(f"{self.url}/__scripted/requests", params=params, timeout=10.0)
        answer.raise_for_status()
        entries: list[dict[str, Any]] = answer.json()["requests"]
        return entries

    def clear(self) -> None:
        """Empty the journal."""
        httpx.delete(f"{self.url}/__scripted/requests", timeout=10.0).raise_for_status()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        with httpx.Client(timeout=1.0) as probe:
            while True:
                if self._thread is None or not self._thread.is_alive():
                    self.stop()
                    raise RuntimeError("scripted LLM server thread exited during start-up")
                try:
                    if probe.get(f"{self.url}/__scripted/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"scripted LLM server did not start within {_STARTUP_TIMEOUT_S}s")
                time.sleep(0.02)
