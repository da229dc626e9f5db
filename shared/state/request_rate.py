"""RequestRate: an organisation's requests per minute, counted in Redis by every gateway together.

A fixed window: one counter per organisation and minute (Unix minutes of the gateway's clock),
``INCR`` and ``EXPIRE`` in one pipelined round trip. A request whose count passes the limit is refused
(429 ``rate_limited``) with ``Retry-After`` the seconds left in the minute; refused requests count too,
which changes nothing (the window is full either way). Each minute admits at most the limit, so any
60 s straddling two minutes admits at most twice the limit. Gateways whose clocks differ by a few
seconds count a request near the turn of a minute in different windows; nothing more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import redis.asyncio as aioredis

from shared.state.keys import request_window_key

__all__ = ["WINDOW_SECONDS", "RateVerdict", "RequestRate"]

WINDOW_SECONDS = 60
_KEEP_SECONDS = 2 * WINDOW_SECONDS
"""How long a window's counter outlives its start (it is never read after its minute)."""


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """Whether a request may go and, if not, how long until the next window opens (whole seconds)."""

    allowed: bool
    count: int
    retry_after: int = 0


class RequestRate:
    """Counts requests per organisation and minute on an asyncio Redis client."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client

    async def hit(self, org_id: str, *, limit: int, now: float) -> RateVerdict:
        """Count one request of ``org_id`` at ``now`` (Unix time) against ``limit`` per minute.

        Writes the organisation's counter of the current minute (one round trip).

        Raises:
            redis.RedisError: Redis did not answer.
        """
        window = int(now // WINDOW_SECONDS)
        key = request_window_key(org_id, window)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, _KEEP_SECONDS)
            count, _ = await pipe.execute()
        if int(count) <= limit:
            return RateVerdict(True, int(count))
        left = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
        return RateVerdict(False, int(count), left)
