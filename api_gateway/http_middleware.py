"""Pure ASGI middleware for HTTP requests: the pass-through for other scopes, and the answered request.

Pure ASGI rather than Starlette's ``BaseHTTPMiddleware``, which would wrap errors raised while the
body is read; so a middleware sees 413s and errors too.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AnsweredRequestMiddleware", "HttpMiddleware"]


class HttpMiddleware:
    """Runs :meth:`handle` for each HTTP request; lifespan and websocket scopes pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request through ``self.app``."""
        raise NotImplementedError


class AnsweredRequestMiddleware(HttpMiddleware):
    """Calls :meth:`answered` once each HTTP request is answered, with its status and duration."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status = 500

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            self.answered(scope, status, time.perf_counter() - started)

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        """Note a request answered with ``status`` (500 when the app failed before answering) after ``seconds``."""
        raise NotImplementedError
