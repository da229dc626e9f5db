"""Schema migrations: ``aptix db upgrade`` runs Alembic to head on the configured database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from shared.db.engine import normalise_database_url

__all__ = ["alembic_config", "upgrade"]

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
