"""Scratch services: a PostgreSQL database and two Redis databases of the bench's own, gone afterwards.

:class:`ScratchServices` creates ``aptix_bench_<random>`` on the given PostgreSQL server and
migrates it (and, asked, an empty database of the same prefix per durable peer:
:meth:`ScratchServices.peer_database`), and claims two empty Redis databases (state and broker)
from index 8 upward (the test suite claims from 15 downward), or one on each server when the state
store has a server of its own (``--state-url``; a Redis Cluster is used whole, its ``aptix:*`` keys
deleted at the end); on exit, also after Ctrl-C or a failure, it drops the databases and flushes
the claimed Redis databases. It also finds the services' processes for the CPU accounting.
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
from shared.redis_cluster import is_cluster_url
from shared.state.scripts import is_cluster

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
        state_url: the state store's own Redis server or Redis Cluster (``--state-url``); None: ``redis_url``'s.
    """

    def __init__(self, *, database_url: str, redis_url: str, state_url: str | None = None) -> None:
        self._admin = make_url(normalise_database_url(database_url))
        self._redis_url = redis_url
        self._state_server = state_url
        """Another Redis server for the state store (a scratch database is claimed there), or a Redis Cluster
        the bench uses whole (its ``aptix:*`` keys are deleted at the end); None: the broker's server."""
        self._claims: list[tuple[str, int]] = []
        self._servers: list[tuple[str, redis.Redis]] | None = None
        self._run_id = uuid.uuid4().hex
        self._database: str | None = None
        self._peer_databases: list[str] = []
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
        """Drop the scratch databases and flush the claimed Redis databases (safe to call twice)."""
        if self._admin_connection is not None:
            self._admin_connection.close()
            self._admin_connection = None
        for name in [*self._peer_databases, *([self._database] if self._database is not None else [])]:
            with psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self._database, self._peer_databases = None, []
        for server, index in self._claims:
            redis_client(redis_db_url(server, index)).flushdb()
        self._claims = []
        if self.scratch is not None and is_cluster_url(self.scratch.state_url):
            client = redis_client(self.scratch.state_url, max_connections=4)
            keys = list(client.scan_iter(match="aptix:*", count=1000))
            for start in range(0, len(keys), 1000):
                pipe = client.pipeline(transaction=False)
                for key in keys[start : start + 1000]:
                    pipe.delete(key)
                pipe.execute()
            client.close()

    def describe(self) -> str:
        """The servers' versions and what the bench uses on them."""
        assert self.scratch is not None, "describe() is for a started ScratchServices"
        info = redis_client(self.scratch.broker_url).info("server")
        version = self._admin_query("SHOW server_version")
        broker_db = urlsplit(self.scratch.broker_url).path.strip("/")
        if self._state_server is None:
            state_db = urlsplit(self.scratch.state_url).path.strip("/")
            where = f"at {_host_port(self._redis_url)} (db {state_db} state, db {broker_db} broker)"
        elif is_cluster_url(self.scratch.state_url):
            nodes = len(redis_client(self.scratch.state_url, max_connections=2).get_nodes())  # type: ignore[attr-defined]
            where = (
                f"state on a Redis Cluster of {nodes} nodes ({self.scratch.state_url}), broker at "
                f"{_host_port(self._redis_url)} db {broker_db}"
            )
        else:
            state_db = urlsplit(self.scratch.state_url).path.strip("/")
            where = (
                f"state at {_host_port(self.scratch.state_url)} db {state_db}, broker at "
                f"{_host_port(self._redis_url)} db {broker_db}"
            )
        return (
            f"PostgreSQL {version} at {self._admin.host}:{self._admin.port or 5432} (scratch database "
            f"{self._database}), Redis {info.get('redis_version')} {where}"
        )

    def redis_servers(self) -> list[tuple[str, redis.Redis]]:
        """The Redis servers to count, by role: ``state+broker`` when one server holds both, else each."""
        assert self.scratch is not None
        if self._servers is None:
            broker = redis_client(self.scratch.broker_url)
            if self._state_server is None:
                self._servers = [("state+broker", broker)]
            else:
                self._servers = [("state", redis_client(self.scratch.state_url, max_connections=4)), ("broker", broker)]
        return self._servers

    def redis_members(self, table: ProcessTable) -> Collection[int]:
        """The pids of the redis-servers (broker, state store, each cluster node) on this machine (``INFO server``)."""
        pids = set()
        for _role, client in self.redis_servers():
            infos = (
                [client.info("server", target_nodes=node) for node in client.get_nodes()]  # type: ignore[attr-defined]
                if is_cluster(client)
                else [client.info("server")]
            )
            pids |= {int(info.get("process_id", 0)) for info in infos}
        return {pid for pid in pids if pid in table and table[pid].comm.startswith("redis")}

    def postgres_members(self, table: ProcessTable) -> Collection[int]:
        """The PostgreSQL server's own processes and the backends of the scratch database.

        Backends of other databases (other test runs on a shared server) are left out while they
        run; the server processes (postmaster, writers, checkpointer, autovacuum launcher) are shared
        work. Counted as a tree (``cpu.Group.tree``), the postmaster also brings the CPU of every
        backend that ended between two samples: the scratch database's connections a pool closed, and
        any other database's that ended meanwhile (on a machine where nothing else runs, none: the
        bench's own queries go through the one admin connection it keeps open).
        """
        return self.database_members(table, self._database)

    def database_members(self, table: ProcessTable, database: str | None) -> Collection[int]:
        """The PostgreSQL server's own processes and the backends of ``database`` (as :meth:`postgres_members`)."""
        rows = self._admin_rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s OR backend_type <> 'client backend'",
            (database,),
        )
        pids = {int(pid) for (pid,) in rows if isinstance(pid, int)}
        postmasters = {table[pid].ppid for pid in pids if pid in table}
        return {pid for pid in pids | postmasters if pid in table and table[pid].comm.startswith("postgres")}

    def peer_database(self, peer: str) -> tuple[str, str]:
        """Create an empty database for a durable peer, dropped with the rest at the end.

        Returns:
            Its name and its psycopg connection string.
        """
        name = f"aptix_bench_{self._run_id[:12]}_{peer}"
        with psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._peer_databases.append(name)
        return name, self._dsn(name)

    def _create(self) -> Scratch:
        name = f"aptix_bench_{self._run_id[:12]}"
        with psycopg.connect(self._dsn(self._admin.database or "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._database = name
        database_url = self._admin.set(database=name).render_as_string(hide_password=False)
        from shared.db.migrate import upgrade

        upgrade(database_url)
        if self._state_server is None:
            state_db, broker_db = self._claim_redis_databases(self._redis_url, 2)
            state_url = redis_db_url(self._redis_url, state_db)
        else:
            (broker_db,) = self._claim_redis_databases(self._redis_url, 1)
            state_url = self._state_server
            if not is_cluster_url(self._state_server):
                (state_db,) = self._claim_redis_databases(self._state_server, 1)
                state_url = redis_db_url(self._state_server, state_db)
        self.scratch = Scratch(
            database_name=name,
            database_url=database_url,
            dsn=self._dsn(name),
            state_url=state_url,
            broker_url=redis_db_url(self._redis_url, broker_db),
        )
        return self.scratch

    def _claim_redis_databases(self, server: str, count: int) -> list[int]:
        claimed: list[int] = []
        for index in range(FIRST_REDIS_DB, _LAST_REDIS_DB + 1):
            client = redis_client(redis_db_url(server, index))
            try:
                empty = client.dbsize() == 0
            except redis.ResponseError:  # the server has fewer databases
                break
            if empty and client.set(_OWNER_KEY, self._run_id, nx=True, ex=_CLAIM_SECONDS):
                if client.dbsize() == 1:
                    self._claims.append((server, index))
                    claimed.append(index)
                    if len(claimed) == count:
                        return claimed
                    continue
                client.delete(_OWNER_KEY)  # someone else wrote there at the same moment
        raise RuntimeError(f"no {count} empty Redis databases from {FIRST_REDIS_DB} upward at {_host_port(server)}")

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
