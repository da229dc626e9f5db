"""The plans PostgreSQL gives a batch's hot reads: each page of its turns (``BatchRepository.turns``)
reads that page only, wherever it is in the batch, and the end-of-batch check every gateway polls
(``OpenAIBatchRepository.ended_unnoted``) reads at most one index entry per batch in progress.

Each statement the repository sends is run again under ``EXPLAIN (ANALYZE, FORMAT JSON)``, with its
own parameters (the plan a one-off statement gets) and as a prepared statement forced to its generic
plan (the plan psycopg's prepared statements may get once a connection ran it five times). A page that
sorted or filtered the rest of the batch (an ``OFFSET``, or no index in request order) reads more rows
of ``turns`` than the page holds, and fails.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, text

from shared.db.batches import BatchRecord, BatchRepository, ReusedTurn
from shared.db.engine import create_db_engine, session_factory
from shared.db.openai_batches import OpenAIBatchRecord, OpenAIBatchRepository
from shared.db.records import NewTurn
from tests.support.databases import fresh_database
from tests.unit.fakes import FIXED_NOW

_TURNS = 1500
_CHUNK = 100


_OTHER_TURNS = 6000
"""Turns of another organisation's batch recorded first: in production a batch is a small part of ``turns``.
Without them the table is little more than the batch under test, and PostgreSQL rightly reads a page near
its end with a sequential scan of the whole small table (what earlier tests left there decided it)."""


@pytest.fixture(scope="module")
def database_url(services: None) -> Iterator[str]:
    """A database of this module's own: on the session's, the test system's gateway notes the end of every
    batch whose turns all ended, and could note the batch under test between its update and the poll."""
    with fresh_database("aptix_plans") as url:
        yield url


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    _batch(BatchRepository(session_factory(engine)), _OTHER_TURNS, org_id="others")
    yield engine
    engine.dispose()


def test_each_page_of_a_batchs_turns_reads_that_page_only(engine: Engine, database_url: str) -> None:
    # Given a batch of 1,500 turns, three of its requests answered by earlier turns
    batches = BatchRepository(session_factory(engine))
    _, earlier = _batch(batches, 3)
    reused = [ReusedTurn(index, turn) for index, turn in zip((0, 700, _TURNS + 2), earlier, strict=True)]
    batch_id, _ = _batch(batches, _TURNS, reused=reused)
    _analyze(engine)

    # When its turns are read, 100 a page
    with _statements(engine) as sent:
        read = list(batches.turns(batch_id, chunk=_CHUNK))

    # Then every request comes once, in order
    ids = [turn.turn_id for turn in read]
    assert len(ids) == len(set(ids)) == _TURNS + 3
    assert [ids[0], ids[700], ids[-1]] == earlier
    assert [turn.batch_index for turn in read if turn.batch_id == batch_id] == sorted(
        set(range(_TURNS + 3)) - {0, 700, _TURNS + 2}
    )
    # And no page's plan reads more rows of turns than a page holds, nor filters rows out of them
    pages = [(sql, params) for sql, params in sent if sql.lstrip().upper().startswith("SELECT")]
    assert len(pages) >= _TURNS // _CHUNK
    for sql, params in pages:
        for plan in _plans(database_url, sql, params):
            read_rows, removed = _turns_rows(plan)
            assert read_rows <= _CHUNK and removed == 0, (read_rows, removed, json.dumps(plan, indent=1))


def test_the_end_of_batch_check_reads_one_index_entry_per_batch_in_progress(engine: Engine, database_url: str) -> None:
    # Given three OpenAI batches in progress: one whose turns all ended, one whose turns are all queued, and
    # one whose turns ended but for its last, still running
    db = session_factory(engine)
    batches, openai = BatchRepository(db), OpenAIBatchRepository(db, outbox=None)
    ended, queued, last_running = (_openai_batch(openai, batches) for _ in range(3))
    with engine.begin() as conn:
        conn.execute(text("UPDATE turns SET status = 'completed' WHERE batch_id IN (:a, :c)"),
                     {"a": ended, "c": last_running})  # fmt: skip
        conn.execute(text("UPDATE turns SET status = 'running' WHERE batch_id = :c AND batch_index = :i"),
                     {"c": last_running, "i": _TURNS - 1})  # fmt: skip
    _analyze(engine)

    # When a gateway polls for batches whose last request ended
    with _statements(engine) as sent:
        found = openai.ended_unnoted()

    # Then it finds the one that ended only
    assert ended in found and queued not in found and last_running not in found
    # And its plan reads at most one row of turns per batch it looks at, and filters none out
    ((sql, params),) = sent
    for plan in _plans(database_url, sql, params):
        read_rows, removed = _turns_rows(plan)
        assert read_rows <= _batches_in_progress(engine) and removed == 0, json.dumps(plan, indent=1)


def _batch(
    batches: BatchRepository, size: int, *, reused: list[ReusedTurn] | None = None, org_id: str = "plans"
) -> tuple[str, list[str]]:
    """Record a batch of ``size`` queued turns and the ``reused`` ones in the other places; its id and its turns'."""
    batch_id = f"batch_{uuid.uuid4().hex}"
    reused = reused or []
    taken = {r.batch_index for r in reused}
    indexes = [index for index in range(size + len(reused)) if index not in taken]
    turns = (
        NewTurn(turn_id=f"turn_{uuid.uuid4().hex}", session_id=f"sess_{uuid.uuid4().hex}", org_id=org_id,
                user_id="u", new_session=True, requested_mode=None, request={"input": "q" * 200}, request_hash="h",
                batch_id=batch_id, batch_index=index)
        for index in indexes
    )  # fmt: skip
    record = BatchRecord(batch_id=batch_id, org_id=org_id, user_id="u", total=len(indexes) + len(reused),
                         created_at=FIXED_NOW, reused=len(reused))  # fmt: skip
    with batches.creating(record, turns, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(hours=1),
                          reused=reused) as turn_ids:  # fmt: skip
        created = list(turn_ids)
    return batch_id, created


def _openai_batch(openai: OpenAIBatchRepository, batches: BatchRepository) -> str:
    """An OpenAI batch in progress, its Aptix batch of :data:`_TURNS` queued turns."""
    batch_id, _ = _batch(batches, _TURNS)
    openai.add(OpenAIBatchRecord(batch_id=batch_id, org_id="plans", user_id="u", input_file_id="file-x",
                                 endpoint="/v1/responses", completion_window="24h", client_metadata=None,
                                 output_expires_seconds=None, webhook_url=None, idempotency_key=None,
                                 request_hash="h", created_at=FIXED_NOW,
                                 expires_at=FIXED_NOW + timedelta(days=1)))  # fmt: skip
    openai.start(batch_id, total=_TURNS, at=FIXED_NOW)
    return batch_id


def _batches_in_progress(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM openai_batches WHERE in_progress_at IS NOT NULL AND ended_at IS NULL")
            ).scalar_one()
        )


def _analyze(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("ANALYZE turns"))
        conn.execute(text("ANALYZE batch_reused_turns"))
        conn.execute(text("ANALYZE openai_batches"))


@contextmanager
def _statements(engine: Engine) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The statements (and their parameters) sent on ``engine`` within the block."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def note(_conn: object, _cursor: object, statement: str, parameters: Any, *_rest: object) -> None:
        sent.append((statement, dict(parameters or {})))

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _plans(database_url: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """``sql``'s plans as run: with ``params`` bound (a custom plan), then prepared and forced to its generic plan."""
    dsn = database_url.replace("postgresql+psycopg://", "postgresql://")
    names: list[str] = []
    numbered = re.sub(r"%\((\w+)\)s", lambda m: _number(names, m.group(1)), sql)
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.ClientCursor(conn) as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        custom = _root(cursor.fetchone())
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE probe AS {numbered}")
        values = ", ".join(["%s"] * len(names))
        execute = (
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe({values})"
            if names
            else "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE probe"
        )
        cursor.execute(execute, [params[name] for name in names])
        generic = _root(cursor.fetchone())
    return [custom, generic]


def _number(names: list[str], name: str) -> str:
    if name not in names:
        names.append(name)
    return f"${names.index(name) + 1}"


def _root(row: Any) -> dict[str, Any]:
    document = row[0]
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    assert isinstance(plan, dict)
    return plan


def _turns_rows(plan: dict[str, Any]) -> tuple[int, int]:
    """Rows the plan's scans of ``turns`` returned (over all their loops), and rows they or a join filtered out."""
    read = removed = 0
    for node in _nodes(plan):
        loops = int(node.get("Actual Loops", 1))
        if node.get("Relation Name") == "turns":
            read += int(node.get("Actual Rows", 0) * loops)
            removed += int(node.get("Rows Removed by Filter", 0) * loops)
            removed += int(node.get("Rows Removed by Index Recheck", 0) * loops)
        removed += int(node.get("Rows Removed by Join Filter", 0) * loops)
    return read, removed


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)
