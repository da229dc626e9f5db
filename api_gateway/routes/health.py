"""``/healthz`` (liveness) and ``/readyz`` (database at the schema this code needs, Redis and broker
answer, and at least one API key can be accepted, from ``APTIX_API_KEYS`` or the database: a gateway
that answers every request 401 is not ready)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import Gateway
from api_gateway.errors import error_response
from api_gateway.openapi import error_responses
from api_gateway.wiring import GatewayWiring
from shared.db.migrate import head_revision, schema_revision
from shared.models.health import Liveness, Readiness

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness, operation_id="getLiveness", summary="Liveness")
async def healthz() -> Liveness:
    """The process is up."""
    return Liveness(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    operation_id="getReadiness",
    summary="Readiness",
    response_description="Every check passed.",
    responses=error_responses(
        specific={
            503: (
                "`unavailable`: a check failed; the message names it and how to fix it, `details` gives each "
                "check's state (`ok` or `down`)."
            )
        }
    ),
)
async def readyz(gateway: Gateway) -> JSONResponse:
    """Every dependency answers and the schema is migrated; 503 naming what is not."""
    revision, checks = await run_in_threadpool(_check_all, gateway)
    ready = all(checks.values())
    body = {
        "status": "ready" if ready else "unavailable",
        "checks": {k: "ok" if v else "down" for k, v in checks.items()},
        "schema": {"revision": revision, "required": head_revision()},
    }
    if ready:
        return JSONResponse(body)
    down = ", ".join(name for name, ok in checks.items() if not ok)
    message = f"not ready: {down}"
    if checks["database"] and not checks["schema"]:
        message += f" (database at revision {revision}, this gateway needs {head_revision()}: run `aptix db upgrade`)"
    if not checks["api_keys"]:
        message += (
            " (no API keys: create one with `aptix keys create --org ORG`, or set APTIX_API_KEYS to "
            "key:org_id:user_id triples; else every request is a 401)"
        )
    return error_response(503, "unavailable", message, details=body["checks"])


def _check_all(gateway: GatewayWiring) -> tuple[str | None, dict[str, bool]]:
    revision, database = _database(gateway)
    schema = database and revision == head_revision()
    checks = {
        "database": database,
        "schema": schema,
        "redis": _redis(gateway),
        "broker": _broker(gateway),
        "api_keys": _api_keys(gateway, schema=schema),
    }
    return revision, checks


def _database(gateway: GatewayWiring) -> tuple[str | None, bool]:
    try:
        return schema_revision(gateway.engine), True
    except Exception:  # any driver error means "not ready"; the reason goes to the log
        logger.warning("readiness: database check failed", exc_info=True)
        return None, False


def _api_keys(gateway: GatewayWiring, *, schema: bool) -> bool:
    if gateway.authenticator.has_env_keys or not schema:
        return gateway.authenticator.has_env_keys
    try:
        return gateway.authenticator.accepts_some_key()
    except Exception:
        logger.warning("readiness: the API key check failed", exc_info=True)
        return False


def _redis(gateway: GatewayWiring) -> bool:
    try:
        return bool(gateway.redis.ping())
    except Exception:
        logger.warning("readiness: redis check failed", exc_info=True)
        return False


def _broker(gateway: GatewayWiring) -> bool:
    try:
        with gateway.producer.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:
        logger.warning("readiness: broker check failed", exc_info=True)
        return False
