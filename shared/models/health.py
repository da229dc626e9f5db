"""What `GET /healthz` and `GET /readyz` answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Liveness", "Readiness", "SchemaState"]


class Liveness(BaseModel):
    """`GET /healthz`: the process is up."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    status: Literal["ok"]
    """Always `ok`."""


class SchemaState(BaseModel):
    """The database schema's revision against the one this gateway needs."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    revision: str | None
    """The database's Alembic revision (null: not migrated, or the database did not answer)."""
    required: str
    """The revision this gateway needs (`aptix db upgrade` brings the database to it)."""


class Readiness(BaseModel):
    """`GET /readyz` when every check passes (otherwise a 503 error body whose details name each check's state)."""

    model_config = ConfigDict(populate_by_name=True, use_attribute_docstrings=True)

    status: Literal["ready"]
    """Always `ready` here."""
    checks: dict[str, Literal["ok", "down"]]
    """Each check's state: `database`, `schema`, `redis`, `broker`, `api_keys`."""
    schema_: SchemaState = Field(alias="schema")
    """The database schema's revision and the one required."""
