"""Redis clients from a URL: the one place an Aptix process builds one (state store, leases, limiter,
admission, event logs and streams, the broker's watch and queue depths).

A URL names one Redis server (``redis://``, ``rediss://``, ``unix://``: redis-py's own URL forms), a
Redis Cluster (``redis+cluster://HOST:PORT[,HOST:PORT...]``, the state store only: ``shared.redis_cluster``)
or a primary that Redis Sentinel manages::

    sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]

The hosts are sentinels; ``MASTER_NAME`` is the name they monitor the primary under; ``DB`` is 0 when
left out. A user and password in the URL are the Redis nodes' (the primary's and its replicas'); the
sentinels' own password, when they have one, is ``APTIX_REDIS_SENTINEL_PASSWORD`` (``sentinel_password``
here). A Sentinel client asks a sentinel for the primary's address on each new connection and drops
its connections when the address changed, so after a failover every process follows the new primary
without a restart. A reply ``READONLY`` on such a connection (a demoted primary still answering) closes
it and is raised as ``redis.ConnectionError``: a connection error, retried later like any other.

:func:`broker_connection` says the same to kombu: its ``sentinel://`` transport and the transport
options that name the primary (Celery's ``broker_url`` and ``broker_transport_options``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
from redis.sentinel import Sentinel, SentinelConnectionPool

from shared.redis_cluster import async_cluster_client, cluster_client, is_cluster_url, parse_cluster_url

__all__ = [
    "FAILOVER_ERRORS",
    "SENTINEL_SCHEME",
    "SERVER_SCHEMES",
    "SentinelUrl",
    "async_redis_client",
    "broker_connection",
    "check_redis_url",
    "is_redis_url",
    "is_refused_for_replicas",
    "parse_sentinel_url",
    "redis_client",
]

SENTINEL_SCHEME = "sentinel"
FAILOVER_ERRORS: tuple[type[Exception], ...] = (
    # A primary demoted by a failover still answered (over a plain redis:// URL; a Sentinel client
    # turns it into a ConnectionError itself). The next try finds the new primary.
    redis.exceptions.ReadOnlyError,
    # A script's EVALSHA reached a new primary whose script cache is empty while the SCRIPT LOAD that
    # redis-py sends after the first NOSCRIPT reached the old one, on a connection opened before the
    # failover: the next try runs both on the new primary.
    redis.exceptions.NoScriptError,
)
"""The replies a Redis failover gives while it settles: reasons to try again later, like a connection error."""
SERVER_SCHEMES = ("redis", "rediss", "unix")
_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """A ``sentinel://`` URL, parsed."""

    sentinels: tuple[tuple[str, int], ...]
    """The sentinels' addresses (host, port), in the URL's order."""
    master: str
    """The name the sentinels monitor the primary under."""
    db: int
    username: str | None
    """The Redis nodes' user (ACL), if any."""
    password: str | None
    """The Redis nodes' password, if any."""


def parse_sentinel_url(url: str) -> SentinelUrl | None:
    """The parts of a ``sentinel://`` URL; None for a URL of another scheme.

    Raises:
        ValueError: a ``sentinel://`` URL without a sentinel, with a bad port, without a master name, or
            with a database that is not a number. The message never repeats the URL (it may hold a password).
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() != SENTINEL_SCHEME:
        return None
    credentials, at, location = rest.rpartition("@")
    if not at:
        credentials, location = "", rest
    hosts, _, path = location.partition("/")
    sentinels = tuple(_address(part) for part in hosts.split(",") if part.strip())
    if not sentinels:
        raise ValueError("a sentinel:// URL names at least one sentinel: sentinel://HOST:PORT[,HOST:PORT...]/MASTER")
    parts = [part for part in path.split("?", 1)[0].split("/") if part]
    if not parts or len(parts) > 2:
        raise ValueError("a sentinel:// URL ends with /MASTER_NAME or /MASTER_NAME/DB")
    if len(parts) == 2 and not parts[1].isdigit():
        raise ValueError("the DB of a sentinel:// URL (after /MASTER_NAME/) is a number")
    username, colon, password = credentials.partition(":")
    return SentinelUrl(
        sentinels=sentinels,
        master=unquote(parts[0]),
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) if colon and password else None,
    )


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server or a Sentinel-managed primary (not some other broker)."""
    return url.partition("://")[0].lower() in (*SERVER_SCHEMES, SENTINEL_SCHEME)


def check_redis_url(url: str) -> str:
    """``url`` when it is a Redis URL this module can connect to (the settings' check of the state store's).

    Raises:
        ValueError: another scheme, or a malformed ``sentinel://`` or ``redis+cluster://`` URL.
    """
    if is_cluster_url(url):
        parse_cluster_url(url)
        return url
    if not is_redis_url(url):
        raise ValueError("must be a redis://, rediss://, unix://, sentinel:// or redis+cluster:// URL")
    parse_sentinel_url(url)
    return url


def redis_client(
    url: str,
    *,
    sentinel_password: str | None = None,
    max_connections: int | None = None,
    wait_seconds: float | None = None,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
    health_check_interval: int = 0,
) -> redis.Redis:
    """A client on a new connection pool to the Redis ``url`` names (a server, or a Sentinel-managed primary).

    Args:
        url: a ``redis://``, ``rediss://``, ``unix://`` or ``sentinel://`` URL.
        sentinel_password: the sentinels' password (``APTIX_REDIS_SENTINEL_PASSWORD``); unused for a server URL.
        max_connections: the most connections the pool opens; None: no bound.
        wait_seconds: with ``max_connections``, a command that finds every connection taken waits this
            long for one, then raises ``redis.ConnectionError``; None: it raises at once.
        socket_timeout: seconds a command waits for its reply; None: forever.
        socket_connect_timeout: seconds a connection may take to open.
        health_check_interval: a connection idle this many seconds is PINGed before its next command.

    Returns:
        The client; closing it closes its pool. A ``redis+cluster://`` URL gives a ``RedisCluster``
        (:func:`shared.redis_cluster.cluster_client`: ``max_connections`` to each node).
    """
    if is_cluster_url(url):
        return cluster_client(
            url,
            max_connections=max_connections or 100,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
        )
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "health_check_interval": health_check_interval,
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    blocking = max_connections is not None and wait_seconds is not None
    if blocking:
        options["timeout"] = wait_seconds
    target = parse_sentinel_url(url)
    pool: redis.ConnectionPool
    if target is None:
        pool = (redis.BlockingConnectionPool if blocking else redis.ConnectionPool).from_url(url, **options)
    else:
        sentinels = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            list(target.sentinels), sentinel_kwargs=_sentinel_options(sentinel_password, options)
        )
        sentinel_pool = _BlockingSentinelPool if blocking else SentinelConnectionPool
        pool = sentinel_pool(target.master, sentinels, is_master=True, **_node_options(target), **options)  # type: ignore[no-untyped-call]
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


def async_redis_client(
    url: str,
    *,
    sentinel_password: str | None = None,
    max_connections: int | None = None,
    socket_timeout: float | None = None,
    socket_connect_timeout: float | None = None,
) -> aioredis.Redis:
    """An asyncio client on a new connection pool to the Redis ``url`` names; past ``max_connections``
    a command raises ``redis.ConnectionError`` at once. The other arguments are :func:`redis_client`'s."""
    if is_cluster_url(url):
        return async_cluster_client(
            url,
            max_connections=max_connections or 100,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
        )
    options: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_connect_timeout}
    if max_connections is not None:
        options["max_connections"] = max_connections
    target = parse_sentinel_url(url)
    if target is None:
        return aioredis.Redis.from_url(url, **options)
    sentinels = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        list(target.sentinels), sentinel_kwargs=_sentinel_options(sentinel_password, options)
    )
    client: aioredis.Redis = sentinels.master_for(target.master, **_node_options(target), **options)
    client.auto_close_connection_pool = True
    return client


def is_refused_for_replicas(exc: BaseException) -> bool:
    """Whether ``exc`` is a primary's ``NOREPLICAS`` refusal: with ``min-replicas-to-write`` set, too few
    replicas acknowledged it lately (one is down or resyncing). An outage to wait out, like a lost connection."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith("NOREPLICAS")


def broker_connection(url: str, *, sentinel_password: str | None = None) -> tuple[str, dict[str, Any]]:
    """Celery's ``broker_url`` for the broker at ``url``, and the transport options it needs besides.

    A ``sentinel://`` URL becomes kombu's form of it (one ``sentinel://`` URL per sentinel, joined by
    ``;``, each with the nodes' credentials and the database) with ``master_name`` and, given a
    ``sentinel_password``, ``sentinel_kwargs``; any other URL is returned as it is, with no options.
    """
    target = parse_sentinel_url(url)
    if target is None:
        return url, {}
    credentials = ""
    if target.username or target.password:
        credentials = f"{quote(target.username or '', safe='')}:{quote(target.password or '', safe='')}@"
    kombu_url = ";".join(f"sentinel://{credentials}{_host(host)}:{port}/{target.db}" for host, port in target.sentinels)
    options: dict[str, Any] = {"master_name": target.master}
    if sentinel_password:
        options["sentinel_kwargs"] = {"password": sentinel_password}
    return kombu_url, options


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A pool of connections to a Sentinel-managed primary that waits for a free connection past its bound,
    as ``redis.BlockingConnectionPool`` does (redis-py has no such pool of its own)."""


def _address(text: str) -> tuple[str, int]:
    split = urlsplit(f"//{text.strip()}")
    try:
        port = split.port or _SENTINEL_PORT
    except ValueError:
        raise ValueError("a sentinel's port in a sentinel:// URL is a number from 1 to 65535") from None
    if not split.hostname:
        raise ValueError("each sentinel of a sentinel:// URL is HOST or HOST:PORT")
    return split.hostname, port


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _node_options(target: SentinelUrl) -> dict[str, Any]:
    return {"db": target.db, "username": target.username, "password": target.password}


def _sentinel_options(password: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """How to connect to the sentinels themselves: the socket timeouts of the nodes' connections, and their password."""
    found = {key: value for key, value in options.items() if key.startswith("socket_") and value is not None}
    if password:
        found["password"] = password
    return found
