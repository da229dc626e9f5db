"""Schema migrations: ``aptix db upgrade`` runs Alembic to head; ``schema_revision`` says where a database is."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from shared.db.engine import normalise_database_url

__all__ = ["alembic_config", "head_revision", "schema_revision", "upgrade"]

_MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(database_url: str) -> Config:
    """An Alembic config pointing at the packaged migrations and ``database_url``."""
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalise_database_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the database at ``database_url`` to ``revision``."""
    command.upgrade(alembic_config(database_url), revision)


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The revision this code needs: the packaged migrations' head."""
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, "the packaged migrations have no head"
    return head


def schema_revision(engine: Engine) -> str | None:
    """The revision the database behind ``engine`` is migrated to; None when it was never migrated.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: when the database does not answer.
    """
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
