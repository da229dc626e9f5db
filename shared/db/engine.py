"""The SQLAlchemy engine and session factory, built from a database URL (one per process)."""

from __future__ import annotations

from typing import Any

import pydantic_core
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["create_db_engine", "normalise_database_url", "session_factory"]


def normalise_database_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs (SQLAlchemy's default driver is psycopg2)."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.removeprefix("postgres://")
    return url


def create_db_engine(url: str, *, pool_size: int = 10, pre_ping: bool = True) -> Engine:
    """An engine for ``url``: a bounded pool on PostgreSQL, WAL and a busy timeout on SQLite.

    Args:
        url: a SQLAlchemy URL.
        pool_size: connections kept open (PostgreSQL only).
        pre_ping: test each connection with a round trip when it leaves the pool (PostgreSQL only).
            Without it a connection the server dropped fails its first statement; SQLAlchemy then
            discards every connection of the pool opened before, so the next try connects afresh.

    Returns:
        The engine.
    """
    url = normalise_database_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=_to_json
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping, json_serializer=_to_json
    )


def _to_json(value: Any) -> str:
    """JSON columns (turn state checkpoints, traces) through pydantic-core's encoder: the standard
    library's was 4 % of an LLM worker's CPU."""
    return pydantic_core.to_json(value).decode()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
