"""The state store on Redis Cluster: ``APTIX_REDIS_URL=redis+cluster://HOST:PORT[,HOST:PORT…]`` names it.

Any node of the cluster may be named (the client asks it for the others and their slots; naming a
few lets it start while one is down). ``rediss+cluster://`` connects with TLS; a password in the URL
(``redis+cluster://:PASSWORD@…`` or ``USER:PASSWORD@…``) is every node's. A cluster has database 0
only: a path other than ``/`` or ``/0`` is refused.

Only the state store (turn state, leases, markers, timers, admission, limiter, breaker, event logs)
runs on a cluster: the broker stays on a single Redis or a Sentinel-managed one, kombu having no
cluster transport (``docs/scaling.md``). ``shared.redis_clients``, where every Aptix process builds its
Redis clients, hands a cluster URL to :func:`cluster_client` (sync) or :func:`async_cluster_client`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

__all__ = [
    "CLUSTER_SCHEMES", "CLUSTER_TRANSIENT_ERRORS", "ClusterUrl", "async_cluster_client", "cluster_client",
    "is_cluster_url", "parse_cluster_url",
]  # fmt: skip

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
"""The URL schemes that name a Redis Cluster (the second with TLS)."""

CLUSTER_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
)
"""A cluster promoting a replica or moving slots (``CLUSTERDOWN``, ``TRYAGAIN``, a slot with no node yet):
like a connection error, a reason to try again later, never a failure of the turn."""


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """What a ``redis+cluster://`` URL says."""

    nodes: tuple[tuple[str, int], ...]
    """The startup nodes (host, port): any nodes of the cluster."""
    username: str | None = None
    password: str | None = None
    tls: bool = False


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterUrl:
    """The nodes and credentials of a cluster URL.

    Raises:
        ValueError: not a cluster URL, no node, a node without a valid port, or a database other than 0
            (the message names the part, never the password).
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster URL: its scheme must be one of {', '.join(CLUSTER_SCHEMES)}")
    rest = rest.split("?", 1)[0]
    location, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster URL names no database (a cluster has database 0 only)")
    userinfo, _, hosts = location.rpartition("@")
    username = password = None
    if userinfo:
        user, has_password, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if has_password else None
    nodes = []
    for entry in filter(None, (part.strip() for part in hosts.split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Redis Cluster node must be HOST:PORT, not {entry!r}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("a Redis Cluster URL names at least one node: redis+cluster://HOST:PORT[,HOST:PORT…]")
    return ClusterUrl(tuple(nodes), username, password, scheme.lower().startswith("rediss"))


def cluster_client(
    url: str,
    *,
    max_connections: int = 100,
    socket_timeout: float | None = 10,
    socket_connect_timeout: float | None = 5,
) -> redis.Redis:
    """A ``RedisCluster`` client of the cluster ``url`` names, typed as the ``redis.Redis`` the state store's
    users take: it answers every command they send (each script and atomic write on one slot). It asks a
    named node for the cluster's slots at once: a process started while none answers fails to start.

    Args:
        url: a ``redis+cluster://`` URL.
        max_connections: the most connections to each node; past it a command waits for a free one (up to
            20 s, redis-py's ``BlockingConnectionPool`` default; ``APTIX_REDIS_MAX_CONNECTIONS``).
        socket_timeout: seconds a reply may take.
        socket_connect_timeout: seconds a connection may take.
    """
    parsed = parse_cluster_url(url)
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.nodes],  # type: ignore[no-untyped-call]
        username=parsed.username,
        password=parsed.password,
        ssl=parsed.tls,
        max_connections=max_connections,
        connection_pool_class=redis.BlockingConnectionPool,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        health_check_interval=30,
    )
    return cast(redis.Redis, client)


def async_cluster_client(
    url: str, *, max_connections: int, socket_timeout: float | None, socket_connect_timeout: float | None
) -> aioredis.Redis:
    """An asyncio ``RedisCluster`` client of ``url`` (the gateway's event streams), typed as the
    ``redis.asyncio.Redis`` they take; ``max_connections`` is per node."""
    parsed = parse_cluster_url(url)
    options: dict[str, Any] = {
        "username": parsed.username, "password": parsed.password, "ssl": parsed.tls,
        "max_connections": max_connections, "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
    }  # fmt: skip
    client = AsyncRedisCluster(startup_nodes=[AsyncClusterNode(host, port) for host, port in parsed.nodes], **options)
    return cast(aioredis.Redis, client)
