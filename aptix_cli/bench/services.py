"""Scratch services: a PostgreSQL database and two Redis databases of the bench's own, gone afterwards.

:class:`ScratchServices` creates ``aptix_bench_<random>`` on the given PostgreSQL server and
migrates it, and claims two empty Redis databases (state and broker) from index 8 upward (the test
suite claims from 15 downward); on exit, also after Ctrl-C or a failure, it drops the database and
flushes both Redis databases. It also finds the services' processes for the CPU accounting.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from types import TracebackType
from typing import LiteralString
from urllib.parse import urlsplit

import psycopg
import redis
from psycopg import sql
from sqlalchemy.engine import make_url

from aptix_cli.bench.cpu import ProcessTable
from shared.db.engine import normalise_database_url
from shared.redis_clients import redis_client

__all__ = ["FIRST_REDIS_DB", "Scratch", "ScratchServices", "redis_db_url"]

FIRST_REDIS_DB = 8
"""The lowest Redis database index the bench claims."""
_LAST_REDIS_DB = 15
_OWNER_KEY = "aptix:bench:owner"
_CLAIM_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class Scratch:
    """Where the bench's data lives during a run."""

    database_name: str
    database_url: str
    """SQLAlchemy URL of the scratch database (``APTIX_DATABASE_URL``)."""
    dsn: str
    """psycopg connection string of the scratch database."""
    state_url: str
    """``APTIX_REDIS_URL``: turn state."""
    broker_url: str
    """``APTIX_BROKER_URL``: the Celery broker."""


class ScratchServices:
    """``with ScratchServices(...) as scratch:``: create, yield, and always clean up.

    Args:
        database_url: a database on the PostgreSQL server the bench may create databases from.
        redis_url: the Redis server (a database index in it is ignored).
    """

    def __init__(self, *, database_url: str, redis_url: str) -> None:
        self._admin = make_url(normalise_database_url(database_url))
        self._redis_url = redis_url
        self._run_id = uuid.uuid4().hex
        self._database: str | None = None
        self._redis_dbs: list[int] = []
        self._admin_connection: psycopg.Connection[tuple[object, ...]] | None = None
        self.scratch: Scratch | None = None

    def __enter__(self) -> Scratch:
        try:
            return self._create()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Drop the scratch database and flush the claimed Redis databases (safe to call twice)."""
        if self._admin_connection is not None:
            self._admin_connection.close()
            self._admin_connection = None
        if self._database is not None:
            with psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self._database)))
            self._database = None
        for index in self._redis_dbs:
            redis_client(redis_db_url(self._redis_url, index)).flushdb()
        self._redis_dbs = []

    def describe(self) -> str:
        """The servers' versions and what the bench uses on them."""
        assert self.scratch is not None, "describe() is for a started ScratchServices"
        info = redis_client(self.scratch.state_url).info("server")
        version = self._admin_query("SHOW server_version")
        state_db, broker_db = self._redis_dbs
        return (
            f"PostgreSQL {version} at {self._admin.host}:{self._admin.port or 5432} (scratch database "
            f"{self._database}), Redis {info.get('redis_version')} at {_host_port(self._redis_url)} "
            f"(db {state_db} state, db {broker_db} broker)"
        )

    def redis_members(self, table: ProcessTable) -> Collection[int]:
        """redis-server's pid (``INFO server``), if it runs on this machine."""
        assert self.scratch is not None
        pid = int(redis_client(self.scratch.state_url).info("server").get("process_id", 0))
        return {pid} if pid in table and table[pid].comm.startswith("redis") else set()

    def postgres_members(self, table: ProcessTable) -> Collection[int]:
        """The PostgreSQL server's own processes and the backends of the scratch database.

        Backends of other databases (other test runs on a shared server) are left out; the server
        processes (postmaster, writers, checkpointer, autovacuum launcher) are shared work.
        """
        rows = self._admin_rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s OR backend_type <> 'client backend'",
            (self._database,),
        )
        pids = {int(pid) for (pid,) in rows if isinstance(pid, int)}
        postmasters = {table[pid].ppid for pid in pids if pid in table}
        return {pid for pid in pids | postmasters if pid in table and table[pid].comm.startswith("postgres")}

    def _create(self) -> Scratch:
        name = f"aptix_bench_{self._run_id[:12]}"
        with psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._database = name
        database_url = self._admin.set(database=name).render_as_string(hide_password=False)
        from shared.db.migrate import upgrade

        upgrade(database_url)
        state_db, broker_db = self._claim_redis_databases(2)
        self.scratch = Scratch(
            database_name=name,
            database_url=database_url,
            dsn=self._dsn(name),
            state_url=redis_db_url(self._redis_url, state_db),
            broker_url=redis_db_url(self._redis_url, broker_db),
        )
        return self.scratch

    def _claim_redis_databases(self, count: int) -> list[int]:
        for index in range(FIRST_REDIS_DB, _LAST_REDIS_DB + 1):
            client = redis_client(redis_db_url(self._redis_url, index))
            try:
                empty = client.dbsize() == 0
            except redis.ResponseError:  # the server has fewer databases
                break
            if empty and client.set(_OWNER_KEY, self._run_id, nx=True, ex=_CLAIM_SECONDS):
                if client.dbsize() == 1:
                    self._redis_dbs.append(index)
                    if len(self._redis_dbs) == count:
                        return list(self._redis_dbs)
                    continue
                client.delete(_OWNER_KEY)  # someone else wrote there at the same moment
        raise RuntimeError(
            f"no {count} empty Redis databases from {FIRST_REDIS_DB} upward at {_host_port(self._redis_url)}"
        )

    def _dsn(self, database: str) -> str:
        return self._admin.set(drivername="postgresql", database=database).render_as_string(hide_password=False)

    def _admin_rows(self, query: LiteralString, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        if self._admin_connection is None or self._admin_connection.closed:
            self._admin_connection = psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True)
        return self._admin_connection.execute(query, params).fetchall()

    def _admin_query(self, query: LiteralString) -> str:
        rows = self._admin_rows(query)
        return str(rows[0][0]) if rows else "?"


def redis_db_url(url: str, index: int) -> str:
    """``url`` with its database index replaced by ``index``."""
    return urlsplit(url)._replace(path=f"/{index}").geturl()


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"
