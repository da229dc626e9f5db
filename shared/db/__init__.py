"""Durable store: SQLAlchemy engine, tables, repositories and Alembic migrations."""

from shared.db.engine import create_db_engine, session_factory

__all__ = ["create_db_engine", "session_factory"]
