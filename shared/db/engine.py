"""The SQLAlchemy engine and session factory, built from a database URL (one per process), and the
size of each process kind's connection pool.

PostgreSQL refuses connections past ``max_connections`` (100 by default, 3 of them kept for
superusers), and every process holds a pool of its own: a pool is sized for what the process can
use at once, not for its concurrency. ``APTIX_DB_POOL_SIZE`` and ``APTIX_DB_MAX_OVERFLOW`` override
the kind's default; deploy/README.md adds up what the deployment files open.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Any, NamedTuple

import pydantic_core
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from shared.settings import Settings

__all__ = [
    "DEFAULT_POOLS",
    "PoolSize",
    "ProcessKind",
    "create_db_engine",
    "engine_for",
    "normalise_database_url",
    "one_statement",
    "pool_size_for",
    "session_factory",
]


class ProcessKind(StrEnum):
    """The kinds of process that open a database pool."""

    GATEWAY = "gateway"
    WORKER = "worker"
    RECONCILER = "reconciler"
    MIGRATION = "migration"


class PoolSize(NamedTuple):
    """A connection pool's bounds: connections kept open, and extra ones opened under load."""

    size: int
    overflow: int

    @property
    def most(self) -> int:
        """The most connections the process opens at once."""
        return self.size + self.overflow


DEFAULT_POOLS: dict[ProcessKind, PoolSize] = {
    # Request handlers reach the database from anyio's worker threads (40 at most), each for a
    # short transaction: 8 connections keep thousands of transactions a second going.
    ProcessKind.GATEWAY: PoolSize(4, 4),
    # One Celery process: 2 pool threads and the reconciler thread at once (the `pipeline` group);
    # more threads, or 2,000 greenlets on the `llm` queue, take turns on short transactions. No
    # overflow: under a batch an overflow connection was opened and closed over and over, a new
    # backend each time, 2.5 ms of PostgreSQL's CPU per turn (docs/benchmarks.md, 2026-11-27, night).
    ProcessKind.WORKER: PoolSize(3, 0),
    # `aptix reconciler`: one scan at a time.
    ProcessKind.RECONCILER: PoolSize(1, 1),
    # `aptix db upgrade` and `aptix db wait`: one connection.
    ProcessKind.MIGRATION: PoolSize(1, 0),
}
"""The pool of each process kind when ``APTIX_DB_POOL_SIZE`` / ``APTIX_DB_MAX_OVERFLOW`` are unset."""


def pool_size_for(settings: Settings, kind: ProcessKind) -> PoolSize:
    """The pool bounds of a process of ``kind``: the settings where given, else the kind's default."""
    default = DEFAULT_POOLS[kind]
    return PoolSize(
        settings.db_pool_size if settings.db_pool_size is not None else default.size,
        settings.db_max_overflow if settings.db_max_overflow is not None else default.overflow,
    )


def engine_for(settings: Settings, kind: ProcessKind, *, name: str = "", pre_ping: bool = True) -> Engine:
    """The engine of a process of ``kind``, its pool sized by :func:`pool_size_for`.

    Args:
        settings: the process's settings.
        kind: what the process is.
        name: what else tells this process apart in ``pg_stat_activity`` (a worker's node name).
        pre_ping: as in :func:`create_db_engine`.

    Returns:
        The engine; PostgreSQL sees its connections as ``application_name`` ``aptix-<kind> <name>``.
    """
    pool = pool_size_for(settings, kind)
    return create_db_engine(
        settings.database_url,
        pool_size=pool.size,
        max_overflow=pool.overflow,
        pre_ping=pre_ping,
        application_name=f"aptix-{kind.value} {name}".strip(),
    )


def normalise_database_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs (SQLAlchemy's default driver is psycopg2)."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.removeprefix("postgres://")
    return url


def create_db_engine(
    url: str, *, pool_size: int = 5, max_overflow: int = 5, pre_ping: bool = True, application_name: str = ""
) -> Engine:
    """An engine for ``url``: a bounded pool on PostgreSQL, WAL and a busy timeout on SQLite.

    Args:
        url: a SQLAlchemy URL.
        pool_size: connections kept open (PostgreSQL only).
        max_overflow: connections opened beyond ``pool_size`` under load and closed when returned
            (PostgreSQL only); the process never holds more than ``pool_size + max_overflow``.
        application_name: how PostgreSQL names these connections (``pg_stat_activity``), at most
            63 characters (PostgreSQL cuts the rest).
        pre_ping: test each connection with a round trip when it leaves the pool (PostgreSQL only).
            Without it a connection the server dropped fails its first statement; SQLAlchemy then
            discards every connection of the pool opened before, so the next try connects afresh.

    Returns:
        The engine.
    """
    url = normalise_database_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=_to_json)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        json_serializer=_to_json,
        connect_args={"application_name": application_name[:63]} if application_name else {},
    )


def _to_json(value: Any) -> str:
    """JSON columns (turn state checkpoints, traces) through pydantic-core's encoder: the standard
    library's was 4 % of an LLM worker's CPU."""
    return pydantic_core.to_json(value).decode()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


_AUTOCOMMIT = {"isolation_level": "AUTOCOMMIT"}


@contextmanager
def one_statement(db: sessionmaker[Session]) -> Iterator[Connection]:
    """A connection for a write whose statements each stand alone (one statement, or a statement and a read
    that need not see one snapshot): on PostgreSQL each is its own transaction (autocommit), so a write is
    one round trip where a transaction of it is three (``BEGIN``, the statement, ``COMMIT``). On SQLite,
    where a round trip is a function call, they run in one transaction as before.

    Not for statements that must land together: those need a transaction (or one statement, as
    ``TurnRepository.checkpoint`` and ``commit`` build on PostgreSQL).

    On PostgreSQL the connection comes straight from the engine's pool, without an ORM session, whose
    setting up and closing cost a fifth of a short statement's CPU (80 of 430 µs on the 2-core AMD EPYC).
    """
    engine: Engine = db.kw["bind"]  # ``session_factory`` binds its engine
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            yield conn.execution_options(**_AUTOCOMMIT)
        return
    with db.begin() as orm:
        yield orm.connection()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
