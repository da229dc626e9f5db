"""SecurityHeadersMiddleware: the standard protective headers on every gateway response.

API answers carry per-organisation data, so no cache may keep them (``Cache-Control: no-store``),
and a browser must never sniff a JSON body into something it renders (``nosniff``). The
interactive docs pages get the same headers minus ``no-store`` (they hold nothing private).
"""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from api_gateway.http_middleware import HttpMiddleware

__all__ = ["SECURITY_HEADERS", "SecurityHeadersMiddleware"]

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)
"""Sent on every response."""

_NO_STORE = (b"cache-control", b"no-store")
_CACHEABLE_PATHS = ("/docs", "/openapi.json")  # /docs also covers /docs-assets/


class SecurityHeadersMiddleware(HttpMiddleware):
    """Adds :data:`SECURITY_HEADERS` (and ``Cache-Control: no-store`` on API paths) to each response."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = list(SECURITY_HEADERS)
        if not scope["path"].startswith(_CACHEABLE_PATHS):
            extra.append(_NO_STORE)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)
