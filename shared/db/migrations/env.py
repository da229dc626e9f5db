"""Alembic environment: runs migrations on the connection or URL given in the config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from shared.db.engine import create_db_engine
from shared.db.tables import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def _online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or ""
    engine = create_db_engine(url, pool_size=1, max_overflow=0, application_name="aptix-migration")
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


_online()
