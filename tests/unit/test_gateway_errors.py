"""api_gateway.errors.schema_missing: which database errors mean "run aptix db upgrade"."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from api_gateway.errors import schema_missing


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("sqlstate", "missing"), [("42P01", True), ("42703", True), ("42601", False)])
def test_postgres_undefined_table_or_column_is_a_missing_schema(sqlstate: str, missing: bool) -> None:
    error = ProgrammingError("SELECT 1", {}, _PgError(sqlstate))
    assert schema_missing(error) is missing


def test_sqlite_no_such_table_is_a_missing_schema() -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(DBAPIError) as raised, engine.connect() as conn:
        conn.execute(text("SELECT * FROM turns"))
    assert schema_missing(raised.value)


def test_a_connection_error_is_not_a_missing_schema() -> None:
    assert not schema_missing(OperationalError("SELECT 1", {}, _PgError("08006")))
    assert not schema_missing(RuntimeError("no such table"))
