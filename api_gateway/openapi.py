"""The gateway's OpenAPI document (``/openapi.json``, browsed at ``/docs``) as the source of truth.

Routes name their own operation ids, summaries and error statuses (:func:`error_responses`); the
bearer scheme comes with the ``Caller`` dependency. :func:`install_openapi` adds what only the whole
document knows: the API description, the shared ``ErrorBody`` schema, and the limits this gateway's
settings put on requests. FastAPI's default 422 (``HTTPValidationError``, ``{"detail": [...]}``) is
not what the gateway answers, so it is replaced where the operation can answer 422 and dropped where
it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from api_gateway.errors import RETRY_AFTER_SECONDS
from shared.models.batch import BatchRequest
from shared.models.error import ErrorBody
from shared.models.turn import NUL_FREE_PATTERN
from shared.settings import Settings

__all__ = ["COMMON_ERRORS", "JSON_LINES", "QUOTA_EXCEEDED", "error_responses", "install_openapi"]

JSON_LINES = "application/jsonl"
"""The media type of a body of JSON Lines (one JSON value per line)."""

COMMON_ERRORS: dict[int, str] = {
    401: "`unauthorized`: no `Authorization: Bearer <key>` header, or a key the gateway does not accept.",
    413: "`request_too_large`: the body is larger than `APTIX_MAX_BODY_BYTES`.",
    422: (
        "`invalid_request`: the body, a query parameter or the JSON itself is not valid (a query parameter "
        "holding a NUL character included); `details` lists `{loc, msg, type}` per problem."
    ),
    429: (
        "`rate_limited`: the caller's organisation made more requests this minute than its limit (`aptix orgs "
        "set --rpm`, every gateway together); nothing was read or recorded. Retry after `Retry-After` seconds."
    ),
    503: (
        "`unavailable`: the database, Redis or the broker did not answer, or the database schema is not "
        "migrated (`aptix db upgrade`); nothing was recorded. Retry after `Retry-After` seconds."
    ),
}
"""What each status means on every operation that can answer it; :func:`error_responses` adds to it."""

QUOTA_EXCEEDED = (
    "`quota_exceeded`: the organisation's turns created this UTC day used its daily tokens (`aptix orgs set "
    "--tokens-per-day`); nothing was recorded. `Retry-After`: the seconds to the next UTC day."
)
"""The 429 of an operation that starts turns (``specific={429: QUOTA_EXCEEDED}``)."""

_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorBody"}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "`Bearer`.", "required": True, "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "Seconds until the organisation is under its limit again (the next minute, or the "
            "next UTC day for `quota_exceeded`).",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    503: {
        "Retry-After": {
            "description": f"Seconds to wait before retrying ({RETRY_AFTER_SECONDS}).",
            "required": True,
            "schema": {"type": "string"},
        }
    },
}


def error_responses(*statuses: int, specific: Mapping[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of an operation: each error status it can answer, with the error envelope.

    Args:
        statuses: statuses whose meaning is the same everywhere (:data:`COMMON_ERRORS`).
        specific: statuses with this operation's own codes and meaning (404, 409, or more on a common one).

    Returns:
        OpenAPI response objects by status, each with the ``ErrorBody`` schema as ``application/json``
        (whatever the operation's success media type) and the headers the gateway always sends with it.
    """
    meanings = {status: COMMON_ERRORS[status] for status in statuses}
    if 401 in meanings:  # an operation that takes a key counts against its organisation's requests per minute
        meanings[429] = COMMON_ERRORS[429]
    for status, text in (specific or {}).items():
        meanings[status] = f"{meanings[status]} {text}" if status in meanings else text
    return {
        status: {
            "description": meanings[status],
            "content": {"application/json": {"schema": _ERROR_SCHEMA}},
            **({"headers": _HEADERS[status]} if status in _HEADERS else {}),
        }
        for status in sorted(meanings)
    }


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` answer the gateway's document, built once on first use.

    Args:
        app: the gateway, with every router included.
        settings: the gateway's settings; the limits they set are written into the document.
    """
    app.description = _description(settings)
    app.openapi_tags = _TAGS
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _finish(generate(), settings)  # FastAPI keeps the document it generated in app.openapi_schema
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise the document


_TAGS = [
    {"name": "turns", "description": "Start a turn, read it (long-poll), post client tool results, cancel, trace."},
    {"name": "sessions", "description": "A session with its mode history and turns; the mode catalog."},
    {
        "name": "batches",
        "description": "Many turns at once (a JSON body or a JSON Lines upload), their progress, their results as "
        "JSON Lines, their cancel, and the organisation's list of batches.",
    },
    {"name": "usage", "description": "The organisation's turns and tokens per day, and its daily token budget."},
    {"name": "health", "description": "Liveness and readiness, without a key."},
]


def _finish(document: dict[str, Any], settings: Settings) -> None:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for operation in _operations(document):
        responses = operation.get("responses", {})
        default_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema")
        if default_422 == {"$ref": "#/components/schemas/HTTPValidationError"}:
            # FastAPI adds it to any operation with a parameter; one that can answer 422 declares its own.
            del responses["422"]
        for response in responses.values():
            lines = response.get("content", {}).get(JSON_LINES)
            if lines is not None:
                # FastAPI types a body that is not JSON as a string; JSON Lines are described by one line's schema.
                lines.get("schema", {}).pop("type", None)
        for parameter in operation.get("parameters", []):
            if parameter.get("in") in ("query", "path"):
                _refuse_nul(parameter.get("schema", {}))
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    error_schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorBody"] = error_schema
    # createBatch reads its body itself (to stream uploads), so FastAPI does not collect its JSON schema.
    batch_schema = BatchRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, schema in batch_schema.pop("$defs", {}).items():
        schemas.setdefault(name, schema)
    schemas.setdefault("BatchRequest", batch_schema)
    batch = schemas.get("BatchRequest", {}).get("properties", {}).get("requests")
    if batch is not None:
        batch["maxItems"] = min(batch.get("maxItems", settings.max_batch_requests), settings.max_batch_requests)


def _refuse_nul(schema: dict[str, Any]) -> None:
    """Say that a string parameter may not hold NUL (``api_gateway.parameters``), unless its own pattern says more."""
    if "pattern" in schema:
        return
    for option in [schema, *schema.get("anyOf", [])]:
        if option.get("type") == "string":
            option.setdefault("pattern", NUL_FREE_PATTERN)


def _operations(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation for path in document.get("paths", {}).values() for operation in path.values()]


def _description(settings: Settings) -> str:
    return f"""\
Aptix runs LLM agent turns: start a turn, long-poll it, answer its client tool calls, read its trace.

**Authentication.** Every operation under `/v1` needs `Authorization: Bearer <key>`, with a key of
`APTIX_API_KEYS` (it stands for an organisation and a user; in `/docs`, use *Authorize*). Every read
and write is scoped to the key's organisation: another organisation's session, turn or batch is a 404.
`/healthz`, `/readyz` and `/metrics` need no key.

**Errors.** Every error answer has one body, `ErrorBody`:
`{{"error": {{"code": "…", "message": "…", "details": …}}}}`. `code` is stable; `details` is a list of
`{{loc, msg, type}}` for `invalid_request`. A 401 carries `WWW-Authenticate: Bearer`, a 429 and a 503
`Retry-After`, a 405 `Allow`. Bad input and a dependency that is down are never a 500.

**Limits.** An organisation may have limits of its own (`aptix orgs set`): requests per minute, every
gateway together (past it, any operation is 429 `rate_limited`), and tokens per UTC day (past it, a new
turn or batch is 429 `quota_exceeded`); `GET /v1/usage` shows its turns and tokens per day.

**Request bodies** are JSON as RFC 8259 defines it: `NaN`, `Infinity`, `-Infinity` and numbers beyond a
64-bit float (`1e999`) are 422, and so are NUL characters and lone surrogates (half a UTF-16 pair) in
any string, tool parameter schemas included, and JSON nested deeper than about a thousand levels. A NUL
character in a query parameter is 422 too. A body over {settings.max_body_bytes} bytes
(`APTIX_MAX_BODY_BYTES`) is 413; a batch holds at most {settings.max_batch_requests} requests
(`APTIX_MAX_BATCH_REQUESTS`). A JSON Lines upload to `POST /v1/batches` may hold
{settings.max_upload_requests} requests (`APTIX_MAX_UPLOAD_REQUESTS`) in {settings.max_upload_bytes} bytes
(`APTIX_MAX_UPLOAD_BYTES`), each line at most {settings.max_body_bytes} bytes (a longer line is 413, naming it).
"""
