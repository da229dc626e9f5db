"""api_gateway.errors: which database errors mean "run aptix db upgrade"; which errors are a 503 to retry."""

from __future__ import annotations

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from api_gateway.errors import install_error_handlers, schema_missing


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


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        # a primary demoted by a failover (over a plain redis:// URL)
        (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), 503),
        # a script loaded on the old primary, run on the new one whose script cache is empty
        (redis.exceptions.NoScriptError("No matching script. Please use EVAL."), 503),
        # min-replicas-to-write with its replica down
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), 503),
        (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), 500),
    ],
)
def test_a_redis_refusal_during_a_failover_is_a_503_to_retry_and_any_other_reply_error_a_500(
    reply: redis.ResponseError, status: int
) -> None:
    # Given a route whose Redis answers with an error reply
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/x")
    def _route() -> None:
        raise reply

    # When it is called
    response = TestClient(app, raise_server_exceptions=False).get("/x")

    # Then a failover's refusals tell the client to retry shortly, as for Redis down; a bug stays a 500
    assert response.status_code == status
    assert response.json()["error"]["code"] == ("unavailable" if status == 503 else "internal_error")
