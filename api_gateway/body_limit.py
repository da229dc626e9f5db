"""BodyLimitMiddleware: refuses request bodies over ``APTIX_MAX_BODY_BYTES`` with 413.

A JSON Lines upload to ``POST /v1/batches`` (``api_gateway.uploads``) has its own limit,
``APTIX_MAX_UPLOAD_BYTES``. Pure ASGI, so it also catches chunked bodies that declare no Content-Length.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api_gateway.errors import error_response
from api_gateway.uploads import is_upload

__all__ = ["BodyLimitMiddleware"]


class _TooLarge(HTTPException):
    # An HTTPException, so FastAPI's body parsing re-raises it instead of answering 400.
    def __init__(self, message: str) -> None:
        super().__init__(status_code=413, detail=message)


class BodyLimitMiddleware:
    """Counts body bytes as they arrive and answers 413 past the limit."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, max_upload_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_upload_bytes = max_upload_bytes if max_upload_bytes is not None else max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = is_upload(scope)
        limit = self.max_upload_bytes if upload else self.max_bytes
        refusal = self._message(upload)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _respond(scope, send, 400, "bad_request", "Content-Length is not a number")
                return
            if int(declared) > limit:
                await _respond(scope, send, 413, "request_too_large", refusal)
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge(refusal)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _respond(scope, send, 413, "request_too_large", refusal)

    def _message(self, upload: bool) -> str:
        if upload:
            return f"the upload is larger than {self.max_upload_bytes} bytes (APTIX_MAX_UPLOAD_BYTES)"
        return f"the request body is larger than {self.max_bytes} bytes (APTIX_MAX_BODY_BYTES)"


async def _respond(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
    # The body of errors.py (OpenAI's under /openai/v1); nothing of the request is read any more.
    response = error_response(status, code, message, path=str(scope.get("path", "")))
    await response(scope, _nothing, send)


async def _nothing() -> Message:
    return {"type": "http.disconnect"}
