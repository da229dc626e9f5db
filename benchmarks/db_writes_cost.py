"""What a turn's two heaviest database writes cost on PostgreSQL: as a transaction, and as one statement in one
round trip (issue 28).

Run from the repo root against a PostgreSQL (a scratch database is created and dropped)::

    .venv/bin/python benchmarks/db_writes_cost.py                 # 750 writes per case and round
    .venv/bin/python benchmarks/db_writes_cost.py --writes 2000 --database-url postgresql://postgres@host/postgres

Cases, on running turns of their own with a ~3 KB state (the size of a server-tool turn's):

- checkpoint, transaction: ``BEGIN``, the snapshot's upsert (only if newer), the deadline push, ``COMMIT``
  (what ``TurnRepository.checkpoint`` ran before, and still runs on SQLite);
- checkpoint, one statement: ``TurnRepository.checkpoint`` on PostgreSQL (``turn_sql.checkpoint_statement``);
- commit point, transaction: ``TurnRepository.commit`` as it runs when the turn's organisation gets
  webhooks (without the outbox row): ``BEGIN``, the turn's update, the transcript's delete and insert,
  the snapshot, the session, ``COMMIT``;
- commit point, one statement: ``TurnRepository.commit`` otherwise (``turn_sql.commit_statement``).

Client CPU is this process's (``time.process_time``), backend CPU that of the one server process
serving it (``/proc/<pid>/stat``: the server must be on this host); wall is the time per write. Each
case runs ``--rounds`` times, interleaved; the figures are the rounds' medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Engine, create_engine, text

from shared.db import turn_sql as sql
from shared.db.engine import normalise_database_url, session_factory
from shared.db.migrate import upgrade
from shared.db.sessions import SessionRepository
from shared.db.turns import NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import TurnStatus, Usage
from shared.webhooks import WebhookConfig

_STATE: dict[str, Any] = {
    "turn_id": "t",
    "steps_done": {f"0:{hop}:reasoner:0": {"turn_id": "t", "step": "reasoner", "hop": hop} for hop in range(10)},
    "trace": [{"seq": seq, "kind": "layer_step", "data": {"detail": "x" * 40}} for seq in range(20)],
    "output_text": "z" * 800,
}
_OUTCOME = TurnOutcome(
    status=TurnStatus.COMPLETED, mode="general", output_text="z" * 800, pending_tool_calls=[], mode_changes=[],
    error=None, usage=Usage(input_tokens=3, output_tokens=4), trace=[],
)  # fmt: skip
_TRANSCRIPT = [("user", "q"), ("assistant", "z" * 800)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--writes", type=int, default=750, help="writes per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    admin = args.database_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"aptix_dbw_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    try:
        upgrade(url)
        engine = create_engine(normalise_database_url(url), pool_size=1, max_overflow=0)
        _run(engine, args.writes, args.rounds)
        engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(engine: Engine, writes: int, rounds: int) -> None:
    db = session_factory(engine)
    # An outbox for no organisation: commits with org_id=None take the transaction, with "o" the statement.
    turns = TurnRepository(db, webhooks=WebhookOutbox(WebhookConfig(secrets={}, default_urls={})))
    now = datetime.now(UTC)

    def checkpoint_transaction(turn_id: str) -> None:
        with db.begin() as orm:
            sql.upsert_snapshot(orm, turn_id, _STATE, now=now, only_if_newer=True)
            orm.execute(sql.PUSH_DEADLINE, {"p_turn_id": turn_id, "p_deadline": now, "p_now": now})

    def checkpoint_statement(turn_id: str) -> None:
        turns.checkpoint(turn_id, _STATE, now=now, deadline_at=now)

    def commit_transaction(turn_id: str) -> None:
        assert turns.commit(turn_id, _OUTCOME, transcript=_TRANSCRIPT, snapshot=_STATE, now=now) is not None

    def commit_statement(turn_id: str) -> None:
        assert turns.commit(turn_id, _OUTCOME, transcript=_TRANSCRIPT, snapshot=_STATE, now=now, org_id="o") is not None

    cases: list[tuple[str, Callable[[str], None]]] = [
        ("checkpoint, transaction", checkpoint_transaction),
        ("checkpoint, one statement", checkpoint_statement),
        ("commit point, transaction", commit_transaction),
        ("commit point, one statement", commit_statement),
    ]
    figures: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in cases}
    for _ in range(rounds):
        for label, write in cases:
            turn_ids = _running_turns(engine, turns, writes)  # a commit ends its turn: fresh turns each time
            backend, client, wall = _backend_cpu(engine), time.process_time(), time.perf_counter()
            for turn_id in turn_ids:
                write(turn_id)
            figures[label].append(
                (
                    (time.process_time() - client) / writes * 1000,
                    (_backend_cpu(engine) - backend) / writes * 1000,
                    (time.perf_counter() - wall) / writes * 1000,
                )
            )
    print(f"{writes} writes per case and round, {rounds} rounds interleaved, medians; PostgreSQL on this host")
    print(f"  {'case':30s} {'client CPU ms':>14s} {'backend CPU ms':>15s} {'wall ms':>8s}")
    for label, rows in figures.items():
        client_ms, backend_ms, wall_ms = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"  {label:30s} {client_ms:14.3f} {backend_ms:15.3f} {wall_ms:8.3f}")


def _running_turns(engine: Engine, turns: TurnRepository, count: int) -> list[str]:
    sessions = SessionRepository(session_factory(engine))
    now = datetime.now(UTC)
    turn_ids = []
    for _ in range(count):
        turn_id, session_id = f"turn_{uuid.uuid4().hex}", f"sess_{uuid.uuid4().hex}"
        sessions.create_if_absent(session_id=session_id, org_id="o", user_id="u", mode="general", now=now)
        turns.create(
            NewTurn(turn_id=turn_id, session_id=session_id, org_id="o", user_id="u", new_session=False,
                    requested_mode=None, request={"input": "q"}, request_hash="h"),
            now=now, deadline_at=now + timedelta(seconds=60),
        )  # fmt: skip
        turns.mark_running(turn_id, now=now, deadline_at=now + timedelta(seconds=60))
        turn_ids.append(turn_id)
    return turn_ids


def _backend_cpu(engine: Engine) -> float:
    """CPU seconds of the server process behind the engine's one connection."""
    with engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
