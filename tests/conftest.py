"""Shared fixtures: real PostgreSQL and Redis, the scripted model, worker and gateway processes.

Each run gets a database of its own (dropped at the end) and two Redis databases (flushed at the
start and end). A service that does not answer fails the run with how to start it. Every Redis
database a test uses is claimed through :func:`redis_databases` (or the ``redis_db_url`` fixture).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
import redis

from tests.services_check import database_admin_url, redis_url, require_services

os.environ.setdefault("APTIX_LLM_LOCAL_ONLY", "1")

KEY_A, ORG_A, USER_A = "test-key-a", "org-a", "user-a"
KEY_B, ORG_B, USER_B = "test-key-b", "org-b", "user-b"
API_KEYS = f"{KEY_A}:{ORG_A}:{USER_A},{KEY_B}:{ORG_B}:{USER_B}"
_OWNER_KEY = "aptix:test:owner"

ConnectRedis = Callable[[], redis.Redis]
"""The ``connect_redis`` fixture: opens a new client on the test's own Redis database."""


@pytest.fixture(scope="session")
def services() -> None:
    """Fail (never skip) when Redis or PostgreSQL does not answer."""
    require_services()


@pytest.fixture(scope="session")
def database_url(services: None) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this run."""
    from shared.db.migrate import upgrade

    name = f"aptix_test_{uuid.uuid4().hex[:12]}"
    admin = database_admin_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    upgrade(url)
    yield url
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def redis_databases(count: int) -> Iterator[list[str]]:
    """The URLs of ``count`` empty Redis databases claimed for the caller; flushed (which frees them) after.

    Raises:
        RuntimeError: not that many databases are free.
    """
    base = redis_url().rstrip("/")
    urls = [f"{base}/{index}" for index in _claim_redis_databases(count, uuid.uuid4().hex)]
    try:
        yield urls
    finally:
        for url in urls:
            with redis.Redis.from_url(url) as client:
                client.flushdb()


@pytest.fixture(scope="session")
def redis_urls(services: None) -> Iterator[tuple[str, str]]:
    """(state URL, broker URL): two empty Redis databases claimed by this run, flushed after it."""
    with redis_databases(2) as (state_url, broker_url):
        yield state_url, broker_url


@pytest.fixture
def redis_db_url(services: None) -> Iterator[str]:
    """One empty Redis database of this test's own (no worker of a running system reads it), flushed after it."""
    with redis_databases(1) as (url,):
        yield url


@pytest.fixture
def connect_redis(redis_db_url: str) -> Iterator[ConnectRedis]:
    """Opens a client on the test's ``redis_db_url``, a connection pool of its own each call; all are closed after."""
    opened: list[redis.Redis] = []

    def connect() -> redis.Redis:
        client = redis.Redis.from_url(redis_db_url)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def redis_client(connect_redis: ConnectRedis) -> redis.Redis:
    """A client on the test's ``redis_db_url``."""
    return connect_redis()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say in the run's summary when the real-traffic fixture checks or the network faults did not run (and how
    to run them)."""
    from tests.chaos.net.hosts import NOT_RUN as NET_NOT_RUN
    from tests.responses_fixtures import NOT_RUN

    for marker in (NOT_RUN, NET_NOT_RUN):
        skipped = [report for report in terminalreporter.stats.get("skipped", []) if marker in str(report.longrepr)]
        if skipped:
            terminalreporter.write_line(f"{len(skipped)} tests skipped: {marker}", yellow=True)


def _claim_redis_databases(count: int, run_id: str) -> list[int]:
    """Claim ``count`` empty Redis databases for this run, so concurrent runs never share a broker."""
    base = redis_url().rstrip("/")
    claimed: list[int] = []
    for index in range(15, 0, -1):
        client = redis.Redis.from_url(f"{base}/{index}")
        if client.dbsize() == 0 and client.set(_OWNER_KEY, run_id, nx=True, ex=6 * 3600):
            if client.dbsize() == 1:
                claimed.append(index)
                if len(claimed) == count:
                    return claimed
                continue
            client.delete(_OWNER_KEY)
    for index in claimed:
        redis.Redis.from_url(f"{base}/{index}").flushdb()
    raise RuntimeError(f"no {count} empty Redis databases are free at {base} (another test run holds them?)")
