"""Which requests are uploads: a JSON Lines body to ``POST /v1/batches`` or a file to ``POST /openai/v1/files``,
with limits of their own.

An upload may be far larger than any other request body (``APTIX_MAX_UPLOAD_BYTES`` instead of
``APTIX_MAX_BODY_BYTES``) and take longer to arrive (``APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS`` instead of
``APTIX_HTTP_BODY_TIMEOUT_SECONDS``). The body limit middleware asks :func:`is_upload`, from the
request's scope alone, before any of the body is read. The longer deadline is granted only once the
caller's key is checked (:func:`grant_upload_time`, by ``api_gateway.deps``): until then the HTTP
server (``api_gateway.server``) holds an upload to the body deadline of any other request, so a client
without a key cannot hold a connection for the upload's deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = [
    "FILES_PATH", "JSON_LINES_TYPES", "UPLOAD_PATH",
    "grant_upload_time", "is_json_lines", "is_upload", "upload_time_granted",
]  # fmt: skip

UPLOAD_PATH = "/v1/batches"
"""The route that takes JSON Lines uploads."""
FILES_PATH = "/openai/v1/files"
"""The route that takes file uploads (multipart); every ``POST`` to it is one."""
JSON_LINES_TYPES = frozenset({"application/jsonl", "application/x-ndjson"})
"""The media types of a JSON Lines upload."""
_UPLOAD_TIME = "aptix.upload_time"
"""The key of the mark :func:`grant_upload_time` leaves in a request's ``scope["state"]``."""


def is_json_lines(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header names JSON Lines (parameters such as ``charset`` aside)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in JSON_LINES_TYPES


def is_upload(scope: Mapping[str, Any]) -> bool:
    """Whether the request of this ASGI scope is a JSON Lines upload to ``POST /v1/batches`` or a file upload
    to ``POST /openai/v1/files``."""
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return False
    if scope.get("path") == FILES_PATH:
        return True
    if scope.get("path") != UPLOAD_PATH:
        return False
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return is_json_lines(value.decode("latin-1"))
    return False


def grant_upload_time(scope: MutableMapping[str, Any]) -> None:
    """Let the body of this authenticated upload take ``APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS`` to arrive.

    Writes a mark into the request's ``scope["state"]``, the one dict every copy of the scope shares
    with the server's (ASGI's lifespan state, copied per request), for :func:`upload_time_granted`.
    """
    scope.setdefault("state", {})[_UPLOAD_TIME] = True


def upload_time_granted(scope: Mapping[str, Any]) -> bool:
    """Whether :func:`grant_upload_time` marked the request of this ASGI scope."""
    state = scope.get("state")
    return state is not None and _UPLOAD_TIME in state
