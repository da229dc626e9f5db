"""``/healthz`` (liveness) and ``/readyz`` (database, Redis and broker answer)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import Gateway
from api_gateway.errors import error_response
from api_gateway.state import GatewayState

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gateway: Gateway) -> JSONResponse:
    """Every dependency answers; 503 naming the ones that do not."""
    checks = await run_in_threadpool(_check_all, gateway)
    ready = all(checks.values())
    body = {"status": "ready" if ready else "unavailable", "checks": {k: "ok" if v else "down" for k, v in checks.items()}}
    if ready:
        return JSONResponse(body)
    down = ", ".join(name for name, ok in checks.items() if not ok)
    return error_response(503, "unavailable", f"dependencies down: {down}", details=body["checks"])


def _check_all(gateway: GatewayState) -> dict[str, bool]:
    return {"database": _database(gateway), "redis": _redis(gateway), "broker": _broker(gateway)}


def _database(gateway: GatewayState) -> bool:
    try:
        with gateway.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception:  # any driver error means "not ready"; the reason goes to the log
        logger.warning("readiness: database check failed", exc_info=True)
        return False


def _redis(gateway: GatewayState) -> bool:
    try:
        return bool(gateway.redis.ping())
    except Exception:
        logger.warning("readiness: redis check failed", exc_info=True)
        return False


def _broker(gateway: GatewayState) -> bool:
    try:
        with gateway.producer.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return True
    except Exception:
        logger.warning("readiness: broker check failed", exc_info=True)
        return False
