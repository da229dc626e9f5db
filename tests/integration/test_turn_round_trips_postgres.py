"""What a turn costs the database on PostgreSQL, hop by hop, in round trips (issue 28): every write of the
hot path is one statement in one round trip, none wrapped in ``BEGIN`` and ``COMMIT``.

A server-tool turn (a tool that is not idempotent, so its "started" and outcome records are written)
driven step by step on a real, migrated PostgreSQL; libpq traces the one connection every repository
uses, and each hop's round trips are the client's ``Sync`` and simple ``Query`` messages. The SQLite
side of the same budget is ``tests/unit/test_round_trips.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import StaticPool

from shared.db.engine import normalise_database_url
from tests.support.pg_trace import traced
from tests.unit.fakes import FakeLlm, answer, calls, catalog_with_counted_tool, make_context, record_turn
from workers.driver import run_step

pytestmark = pytest.mark.integration

SERVER_TOOL_TURN = [
    "request_handler", "reasoner", "compose", "llm_call", "reasoner", "execute_server_tools", "reasoner", "compose",
    "llm_call", "reasoner", "persist",
]  # fmt: skip


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """One connection to the test database (so one trace sees every statement)."""
    db = create_engine(normalise_database_url(database_url), poolclass=StaticPool)
    yield db
    db.dispose()


def test_every_database_write_of_a_server_tool_turn_is_one_round_trip(engine: Engine) -> None:
    key = uuid.uuid4().hex
    llm = FakeLlm(calls(("c1", "counted_tool", {"key": key})), answer("done"))
    ctx = make_context(llm, catalog=catalog_with_counted_tool(), engine=engine)
    message = record_turn(ctx, turn_id=f"turn_{key}", session_id=f"sess_{key}")
    hops: list[tuple[str, int, int]] = []
    while True:
        with traced(engine) as sent:
            dispatch = run_step(ctx, message)
        hops.append((message.step.value, sent.round_trips, sent.transactions))
        if dispatch is None:
            break
        message = dispatch.envelope

    assert [step for step, _, _ in hops] == SERVER_TOOL_TURN
    # request_handler: the turn's start (read back, and its new session created, in the same statement);
    # llm_call: the checkpoint of each model answer; execute_server_tools: the call's "started" and
    # outcome records; persist: the commit point. No transaction anywhere.
    assert [(step, trips) for step, trips, _ in hops] == [
        ("request_handler", 1), ("reasoner", 0), ("compose", 0), ("llm_call", 1), ("reasoner", 0),
        ("execute_server_tools", 2), ("reasoner", 0), ("compose", 0), ("llm_call", 1), ("reasoner", 0),
        ("persist", 1),
    ]  # fmt: skip
    assert sum(transactions for _, _, transactions in hops) == 0
    turn = ctx.turns.get(f"turn_{key}")
    assert turn is not None and turn.status == "completed" and turn.output_text == "done"
