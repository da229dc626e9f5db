"""fresh_database: a migrated PostgreSQL database of a test module's own, dropped afterwards.

For tests that run a reconciler: it re-drives every overdue turn it finds, so on the session's
shared database it could pick up another test's turns.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from shared.db.migrate import upgrade
from tests.services_check import database_admin_url

__all__ = ["fresh_database"]


@contextmanager
def fresh_database(prefix: str, *, password: str | None = None) -> Iterator[str]:
    """A new database, migrated to head; yields its SQLAlchemy URL.

    Args:
        prefix: the start of the database's name.
        password: a password to put in the URL (the test server trusts local connections and ignores it).
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = database_admin_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    user_part, host = admin.removeprefix("postgresql://").split("@", 1)
    user = user_part.split(":", 1)[0]
    credentials = f"{user}:{password}" if password else user
    url = f"postgresql+psycopg://{credentials}@{host.rsplit('/', 1)[0]}/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
