"""Checks that the Redis and PostgreSQL the tests use answer; says how to start them if not.

``python -m tests.services_check`` exits 1 with that message (``make test`` runs it first), and the
test session calls :func:`require_services` so a bare ``pytest`` fails the same way — never a skip.
"""

from __future__ import annotations

import os
import sys

import psycopg
import redis

__all__ = ["database_admin_url", "redis_url", "require_services"]

_START_POSTGRES = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
_START_REDIS = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no '
    "--dir /var/lib/redis --logfile /var/log/redis/ci.log"
)


def database_admin_url() -> str:
    """The PostgreSQL server the tests create their databases on (``APTIX_TEST_DATABASE_URL``)."""
    return os.environ.get("APTIX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def redis_url() -> str:
    """The Redis server the tests use (``APTIX_TEST_REDIS_URL``)."""
    return os.environ.get("APTIX_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def problems() -> list[str]:
    """What does not answer, each with how to start it."""
    found = []
    try:
        redis.Redis.from_url(redis_url(), socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        found.append(f"Redis at {redis_url()} does not answer ({exc}).\n  Start it with: {_START_REDIS}")
    try:
        with psycopg.connect(database_admin_url(), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        found.append(
            f"PostgreSQL at {database_admin_url()} does not answer ({exc}).\n  Start it with: {_START_POSTGRES}"
        )
    return found


def require_services() -> None:
    """Raise RuntimeError naming each service that does not answer."""
    if found := problems():
        raise RuntimeError("the tests need real services:\n" + "\n".join(found))


if __name__ == "__main__":
    if found := problems():
        sys.stderr.write("the tests need real services:\n" + "\n".join(found) + "\n")
        raise SystemExit(1)
    sys.stdout.write("Redis and PostgreSQL answer.\n")
