"""kombu's Redis transport, with one Redis client per channel instead of one per publish and ack.

kombu builds a new ``redis.Redis`` (over the same connection pool) for every message it publishes
and every ack; redis-py 8 fills a table of ~300 response callbacks in each, which measured 5 % of a
worker's CPU. A client over a pool is safe to share between threads and greenlets, so the channel
keeps one, and builds a new one only when its pool was replaced (after a fork or a disconnect).
Everything else is kombu's.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Transport"]


class Channel(kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client."""

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]  # kombu is untyped
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`Channel`."""

    Channel = Channel
