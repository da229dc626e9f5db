"""Shared fixtures: real PostgreSQL and Redis, the scripted model, worker and gateway processes.

Each run gets a database of its own (dropped at the end) and two Redis databases (flushed at the
start and end). A service that does not answer fails the run with how to start it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis

from tests.services_check import database_admin_url, redis_url, require_services

os.environ.setdefault("APTIX_LLM_LOCAL_ONLY", "1")

KEY_A, ORG_A, USER_A = "test-key-a", "org-a", "user-a"
KEY_B, ORG_B, USER_B = "test-key-b", "org-b", "user-b"
API_KEYS = f"{KEY_A}:{ORG_A}:{USER_A},{KEY_B}:{ORG_B}:{USER_B}"
STATE_REDIS_DB = int(os.environ.get("APTIX_TEST_REDIS_STATE_DB", "13"))
BROKER_REDIS_DB = int(os.environ.get("APTIX_TEST_REDIS_BROKER_DB", "14"))


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


@pytest.fixture(scope="session")
def redis_urls(services: None) -> Iterator[tuple[str, str]]:
    """(state URL, broker URL): two Redis databases of this run, flushed before and after."""
    base = redis_url().rstrip("/")
    urls = (f"{base}/{STATE_REDIS_DB}", f"{base}/{BROKER_REDIS_DB}")
    for url in urls:
        redis.Redis.from_url(url).flushdb()
    yield urls
    for url in urls:
        redis.Redis.from_url(url).flushdb()
