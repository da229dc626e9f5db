"""The gateway's own log lines: its start, and one access line per request (uvicorn's access log is off).

The start line (logger ``api_gateway.access_log``) says the URL the gateway listens on, its version,
the database, Redis and broker it uses (passwords hidden) and how many API keys it accepts. Each
request then gets one line from logger ``api_gateway.access``, written when the response is sent::

    POST /v1/turns 202 12.4ms

with the route's template (``/v1/turns/{turn_id}``: never an id; an unmatched request shows its path,
escaped and cut to 200 characters), the status (500 when the app raised) and the duration, and as
context fields the caller's org (when the key was valid), the turn (the path's, or the one
``POST /v1/turns`` created) and the session (likewise). In JSON the line also has ``method``, ``route``, ``status``,
``duration_ms`` and ``key_id`` keys of its own: ``key_id`` names the key that was accepted (``key_…``, or ``env:<n>``
for the n-th of ``APTIX_API_KEYS``; null when none was), never the key itself.
"""

from __future__ import annotations

import logging
from importlib import metadata

from starlette.requests import Request
from starlette.types import Scope

from api_gateway.http_middleware import AnsweredRequestMiddleware
from api_gateway.ids import is_session_id, is_turn_id
from shared.logging import log_context
from shared.redaction import without_password
from shared.settings import Settings

__all__ = ["AccessLogMiddleware", "log_start", "note_caller", "note_turn"]

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("api_gateway.access")

_ORG = "aptix.org_id"
_TURN = "aptix.turn_id"
_SESSION = "aptix.session_id"
_KEY = "aptix.key_id"
_MAX_PATH = 200


def log_start(settings: Settings, url: str) -> None:
    """Log the gateway's start line.

    Args:
        settings: the gateway's settings.
        url: the URL it listens on.
    """
    fields: dict[str, object] = {
        "url": url,
        "version": _version(),
        "database": without_password(settings.database_url),
        "redis": without_password(settings.redis_url),
        "broker": without_password(settings.effective_broker_url),
        "api_keys": len(settings.accepted_api_keys),
        "tracing": settings.otel_enabled,
    }
    logger.info(
        "aptix gateway %s listening on %s; database %s, redis %s, broker %s; %d API key(s) in APTIX_API_KEYS "
        "(and the database's); tracing %s",
        fields["version"], url, fields["database"], fields["redis"], fields["broker"], fields["api_keys"],
        "on" if settings.otel_enabled else "off",
        extra={"fields": fields},
    )  # fmt: skip


def note_caller(request: Request, *, org_id: str, key_id: str) -> None:
    """Record the authenticated caller's org and key id (never the key) for the request's access line."""
    request.scope[_ORG] = org_id
    request.scope[_KEY] = key_id


def note_turn(request: Request, turn_id: str, session_id: str) -> None:
    """Record the turn a request created (and its session), for its access line."""
    request.scope[_TURN] = turn_id
    request.scope[_SESSION] = session_id


class AccessLogMiddleware(AnsweredRequestMiddleware):
    """Logs one line per HTTP request once it is answered (pure ASGI: it sees 413s and errors too)."""

    def answered(self, scope: Scope, status: int, seconds: float) -> None:
        _log_access(scope, status, seconds * 1000)


def _log_access(scope: Scope, status: int, duration_ms: float) -> None:
    route = _route(scope)
    method = str(scope["method"])[:16]
    params = scope.get("path_params", {})
    turn_id = scope.get(_TURN) or params.get("turn_id")
    session_id = scope.get(_SESSION) or params.get("session_id")
    with log_context(
        turn_id=turn_id if isinstance(turn_id, str) and is_turn_id(turn_id) else None,
        session_id=session_id if isinstance(session_id, str) and is_session_id(session_id) else None,
        org_id=scope.get(_ORG),
    ):
        access_logger.info(
            "%s %s %d %.1fms", method, route, status, duration_ms,
            extra={"fields": {"method": method, "route": route, "status": status,
                              "duration_ms": round(duration_ms, 1), "key_id": scope.get(_KEY)}},
        )  # fmt: skip


def _route(scope: Scope) -> str:
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    if template:
        return str(template)
    # A path no route matched is the client's text: escaped, so it cannot forge a line of its own.
    return str(scope.get("path", ""))[:_MAX_PATH].encode("unicode_escape").decode("ascii")


def _version() -> str:
    try:
        return metadata.version("aptix-agent-workers")
    except metadata.PackageNotFoundError:
        return "unknown"
