"""The client-tool timeout sweep: overdue paused turns fail even when nobody reads them.

The timeout is also enforced where it matters — before a read of the turn, before tool results
are accepted, before a new turn on its session (``TurnService``) — so no beat process is needed.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.concurrency import run_in_threadpool

from api_gateway.services.turn_service import TurnService

__all__ = ["sweep_forever"]

logger = logging.getLogger(__name__)


async def sweep_forever(turns: TurnService, *, timeout_seconds: float) -> None:
    """Expire overdue turns periodically (a fraction of the timeout, at most once a minute).

    Args:
        turns: the service that expires them.
        timeout_seconds: ``APTIX_CLIENT_TOOL_TIMEOUT_SECONDS``.
    """
    interval = min(60.0, max(1.0, timeout_seconds / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await run_in_threadpool(turns.expire_overdue)
        except Exception:  # a database blip must not end the sweep
            logger.warning("client-tool timeout sweep failed", exc_info=True)
