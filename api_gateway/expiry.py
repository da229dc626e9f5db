"""Client-tool timeout: a turn waiting longer than ``APTIX_CLIENT_TOOL_TIMEOUT_SECONDS`` fails.

Enforced where it matters — before a read of the turn, before tool results are accepted, before
a new turn on its session — and by a background sweep, so no beat process is needed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from starlette.concurrency import run_in_threadpool

from api_gateway.state import GatewayState
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo

__all__ = ["expire_overdue", "sweep_forever"]

logger = logging.getLogger(__name__)


def expire_overdue(gateway: GatewayState, *, turn_id: str | None = None, session_id: str | None = None) -> int:
    """Fail the overdue waiting turns (one turn, one session's, or all); returns how many."""
    timeout = gateway.settings.client_tool_timeout_seconds
    now = datetime.now(UTC)
    overdue = gateway.turns.overdue_waiting(older_than=now - timedelta(seconds=timeout), session_id=session_id)
    if turn_id is not None:
        overdue = [found for found in overdue if found == turn_id]
    error = ErrorInfo(
        code=ErrorCode.CLIENT_TOOL_TIMEOUT,
        message=f"no client tool results arrived within {timeout}s (APTIX_CLIENT_TOOL_TIMEOUT_SECONDS)",
    )
    expired = 0
    for found in overdue:
        row = gateway.turns.finish_early(
            found, status=TurnStatus.FAILED, error=error, now=now, only_if=(TurnStatus.REQUIRES_CLIENT_TOOLS.value,)
        )
        if row is not None:
            expired += 1
            logger.info("turn %s timed out waiting for client tool results", found)
    return expired


async def sweep_forever(gateway: GatewayState) -> None:
    """Expire overdue turns periodically (a fraction of the timeout, at most once a minute)."""
    interval = min(60.0, max(1.0, gateway.settings.client_tool_timeout_seconds / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(expire_overdue, gateway)
        except Exception:  # a database blip must not end the sweep
            logger.warning("client-tool timeout sweep failed", exc_info=True)
