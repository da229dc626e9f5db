"""kombu's Redis and Sentinel transports, with one Redis client per channel instead of one per publish and ack.

kombu builds a new ``redis.Redis`` (over the same connection pool) for every message it publishes
and every ack; redis-py 8 fills a table of ~300 response callbacks in each, which measured 5 % of a
worker's CPU. A client over a pool is safe to share between threads and greenlets, so the channel
keeps one, and builds a new one only when its pool was replaced (after a fork or a disconnect).
Everything else is kombu's: the Sentinel channel asks the sentinels for the primary's address on each
new connection, and its pool drops its connections when that address changed (a failover).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["SentinelTransport", "Transport"]


class _SharedClient:
    """What both channels share: their synchronous client, built once per pool."""

    _shared_client: Any = None
    pool: Any

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]  # a mixin over kombu's channels
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client


class Channel(_SharedClient, kombu_redis.Channel):
    """A Redis channel that reuses its synchronous client."""


class SentinelChannel(_SharedClient, kombu_redis.SentinelChannel):
    """A Redis Sentinel channel that reuses its synchronous client."""


class Transport(kombu_redis.Transport):
    """kombu's Redis transport on :class:`Channel`."""

    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Redis Sentinel transport on :class:`SentinelChannel`."""

    Channel = SentinelChannel
