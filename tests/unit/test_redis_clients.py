"""shared.redis_clients: ``sentinel://`` URLs parsed, refused when malformed, and turned into the clients
and the kombu broker settings that follow a Sentinel-managed primary. Nothing here connects: the
clients are built lazily (``tests/integration/test_sentinel_failover.py`` runs them on real sentinels)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.sentinel import SentinelConnectionPool

from shared.broker import celery_config
from shared.redis_clients import (
    SentinelUrl,
    async_redis_client,
    broker_connection,
    parse_sentinel_url,
    redis_client,
)
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
URL = "sentinel://10.0.0.1:26379,10.0.0.2:26380,sentinel-c/aptix/2"


def test_a_sentinel_url_names_its_sentinels_master_and_database() -> None:
    assert parse_sentinel_url(URL) == SentinelUrl(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-c", 26379)),
        master="aptix",
        db=2,
        username=None,
        password=None,
    )


def test_the_password_in_a_sentinel_url_is_the_nodes_and_the_database_defaults_to_0() -> None:
    parsed = parse_sentinel_url("sentinel://app:p%40ss@h:1/main")
    assert parsed is not None
    assert (parsed.username, parsed.password, parsed.master, parsed.db) == ("app", "p@ss", "main", 0)
    no_user = parse_sentinel_url("sentinel://:secret@h:1/main")
    assert no_user is not None and (no_user.username, no_user.password) == (None, "secret")


def test_a_url_of_another_scheme_is_no_sentinel_url() -> None:
    assert parse_sentinel_url("redis://127.0.0.1:6379/0") is None


@pytest.mark.parametrize(
    "url",
    ["sentinel:///aptix", "sentinel://h:1", "sentinel://h:1/", "sentinel://h:1/m/x", "sentinel://h:1/m/0/1",
     "sentinel://h:99999/m", "sentinel://h:port/m"],
)  # fmt: skip
def test_a_malformed_sentinel_url_is_refused_by_the_settings_without_echoing_it(url: str) -> None:
    with pytest.raises(ValueError, match="sentinel://"):
        parse_sentinel_url(url)
    for variable in ("redis_url", "broker_url"):
        with pytest.raises(ValidationError) as refused:
            Settings(**{variable: url})
        assert url not in str(refused.value)


def test_the_state_store_url_must_be_a_redis_url_but_the_broker_may_be_another() -> None:
    with pytest.raises(ValidationError, match="sentinel://"):
        Settings(redis_url="amqp://guest@localhost//")
    assert Settings(broker_url="amqp://guest@localhost//").effective_broker_url.startswith("amqp://")


def test_a_sentinel_client_asks_the_sentinels_for_the_primary_with_the_nodes_and_the_sentinels_passwords() -> None:
    client = redis_client(
        "sentinel://app:node-pw@h1:1,h2:2/aptix/3", sentinel_password="sentinel-pw", socket_timeout=4,
        max_connections=7, wait_seconds=10,
    )  # fmt: skip
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and isinstance(pool, redis.BlockingConnectionPool)
    assert pool.is_master and pool.service_name == "aptix" and pool.max_connections == 7 and pool.timeout == 10
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["username"], kwargs["password"], kwargs["socket_timeout"]) == (3, "app", "node-pw", 4)
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"], s["password"], s["socket_timeout"]) for s in sentinels] == [
        ("h1", 1, "sentinel-pw", 4),
        ("h2", 2, "sentinel-pw", 4),
    ]


def test_a_server_url_keeps_a_plain_pool_blocking_only_when_asked() -> None:
    plain = redis_client("redis://127.0.0.1:6379/4", socket_timeout=2)
    assert type(plain.connection_pool) is redis.ConnectionPool
    assert plain.connection_pool.connection_kwargs["db"] == 4
    bounded = redis_client("redis://127.0.0.1:6379/0", max_connections=3, wait_seconds=10)
    assert isinstance(bounded.connection_pool, redis.BlockingConnectionPool)


def test_the_asyncio_client_follows_the_sentinels_too() -> None:
    client = async_redis_client("sentinel://h1:1/aptix/1", max_connections=9, sentinel_password="s")
    pool = client.connection_pool
    assert isinstance(pool, AsyncSentinelPool) and pool.service_name == "aptix" and pool.max_connections == 9
    assert pool.connection_kwargs["db"] == 1
    asyncio.run(client.aclose())


def test_the_broker_on_sentinels_is_kombus_sentinel_transport_naming_the_primary() -> None:
    url, options = broker_connection("sentinel://:node-pw@h1:1,h2/aptix/1", sentinel_password="sentinel-pw")
    assert url == "sentinel://:node-pw@h1:1/1;sentinel://:node-pw@h2:26379/1"
    assert options == {"master_name": "aptix", "sentinel_kwargs": {"password": "sentinel-pw"}}
    assert broker_connection("redis://h:1/1") == ("redis://h:1/1", {})


def test_celery_config_of_a_sentinel_broker_keeps_every_other_transport_option() -> None:
    settings = Settings(broker_url="sentinel://h1:1,h2:2/aptix/1", redis_sentinel_password="sentinel-pw")
    config = celery_config(settings)
    plain = celery_config(Settings(broker_url="redis://h1:1/1"))
    assert config["broker_url"] == "sentinel://h1:1/1;sentinel://h2:2/1"
    assert config["broker_transport"] == "shared.broker_transport:SentinelTransport"
    assert config["broker_transport_options"] == {
        **plain["broker_transport_options"],
        "master_name": "aptix",
        "sentinel_kwargs": {"password": "sentinel-pw"},
    }
    assert plain["broker_transport"] == "shared.broker_transport:Transport"


def test_the_celery_app_connects_through_the_shared_client_sentinel_channel() -> None:
    from workers.app import create_celery

    app = create_celery(Settings(broker_url="sentinel://h1:1/aptix/1"))
    with app.connection_for_write() as connection:
        transport = connection.transport
        assert type(transport).__module__ == "shared.broker_transport"
        assert type(transport).__name__ == "SentinelTransport"
        assert connection.transport_options["master_name"] == "aptix"


def test_redis_clients_is_the_only_place_a_redis_client_is_built() -> None:
    built = re.compile(
        r"\b(?:redis|aioredis|sentinel)\.(?:\w+\.)*(?:Redis|\w*ConnectionPool|Sentinel)(?:\.from_url)?\("
    )
    offenders = []
    for package in ("shared", "workers", "api_gateway", "aptix_cli"):
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() == "shared/redis_clients.py":
                continue
            text = path.read_text()
            offenders += [f"{path.relative_to(ROOT)}: {match.group(0)}" for match in built.finditer(text)]
            offenders += [f"{path.relative_to(ROOT)}: Sentinel(" for _ in re.finditer(r"(?<![\w.])Sentinel\(", text)]
    assert offenders == []
