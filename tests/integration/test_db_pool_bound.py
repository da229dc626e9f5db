"""A worker's database pool bounds its PostgreSQL connections (docs/scaling.md, "Database connections").

The worker logs in as a role of its own whose ``CONNECTION LIMIT`` is its pool + overflow, so
PostgreSQL itself refuses a connection past the bound (the step would then be run again later, and
its log would say ``OperationalError``), and the test counts the role's rows in
``pg_stat_activity`` while the worker runs many turns on 8 threads.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from scripted_llm import ScriptedServer
from shared.db.engine import DEFAULT_POOLS, ProcessKind
from tests.integration.conftest import System, own_system
from tests.support.stack import LocalStack

pytestmark = pytest.mark.integration

POOL, OVERFLOW = 1, 1
TURNS = 40


@pytest.fixture
def bounded_role(database_url: str) -> Iterator[str]:
    """A login role limited to POOL + OVERFLOW connections, with the rights a worker needs; dropped after."""
    yield from _worker_role(database_url, limit=POOL + OVERFLOW)


@pytest.fixture
def worker_role(database_url: str) -> Iterator[str]:
    """A login role with no connection limit, with the rights a worker needs; dropped after."""
    yield from _worker_role(database_url, limit=-1)


def _worker_role(database_url: str, *, limit: int) -> Iterator[str]:
    role = f"aptix_pool_{uuid.uuid4().hex[:10]}"
    admin = _libpq(database_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}")
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    try:
        yield role
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
            )  # fmt: skip
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def gateway_only(
    database_url: str, scripted_llm: ScriptedServer, modes_file: Path
) -> Iterator[tuple[LocalStack, System]]:
    """A gateway on its own broker and state databases, with no worker yet."""
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file) as (stack, system):
        yield stack, system


def test_a_worker_under_load_never_holds_more_than_pool_plus_overflow_connections(
    database_url: str, bounded_role: str, gateway_only: tuple[LocalStack, System]
) -> None:
    stack, system = gateway_only
    worker_url = make_url(database_url).set(username=bounded_role).render_as_string(hide_password=False)
    # Given the tripwire works: PostgreSQL refuses the role a connection past the limit
    held = [psycopg.connect(_libpq(worker_url)) for _ in range(POOL + OVERFLOW)]
    with pytest.raises(psycopg.OperationalError, match="too many connections for role"):
        psycopg.connect(_libpq(worker_url)).close()
    for conn in held:
        conn.close()
    # And a worker of 8 threads logging in as that role, its pool set to POOL + OVERFLOW
    worker = stack.start_worker(
        "pool",
        concurrency=8,
        env={
            "APTIX_DATABASE_URL": worker_url,
            "APTIX_DB_POOL_SIZE": str(POOL),
            "APTIX_DB_MAX_OVERFLOW": str(OVERFLOW),
        },
    )
    sampler = _ConnectionSampler(database_url, bounded_role)
    sampler.start()
    try:
        # When it runs many turns at once, each with a server tool that keeps records
        keys = [uuid.uuid4().hex for _ in range(TURNS)]
        ids = [
            system.post_turn({"input": f'[[call:record_call {{"key": "{key}"}}]] {key}'}).json()["turn_id"]
            for key in keys
        ]
        turns = [system.wait_turn(turn_id, seconds=120) for turn_id in ids]
    finally:
        sampler.stop()
    # Then every turn completed, PostgreSQL never saw more than pool + overflow connections of the
    # worker, each named after it, and the worker never had one refused
    assert [turn["status"] for turn in turns] == ["completed"] * TURNS, [t for t in turns if t["status"] != "completed"]
    assert 1 <= sampler.most <= POOL + OVERFLOW, sampler.most
    assert sampler.names and all(name.startswith("aptix-worker pool@") for name in sampler.names), sampler.names
    assert "OperationalError" not in worker.log() and "too many connections" not in worker.log(), worker.log()


def test_a_gevent_worker_under_load_keeps_its_default_pool_open_instead_of_opening_connections(
    database_url: str, worker_role: str, gateway_only: tuple[LocalStack, System]
) -> None:
    stack, system = gateway_only
    worker_url = make_url(database_url).set(username=worker_role).render_as_string(hide_password=False)
    # Given a worker on a gevent pool with the default pool bounds (shared.db.engine.DEFAULT_POOLS)
    worker = stack.start_worker("churn", pool="gevent", concurrency=200, env={"APTIX_DATABASE_URL": worker_url})
    sampler = _ConnectionSampler(database_url, worker_role)
    sampler.start()
    try:
        # When many turns reach its database at once
        ids = [system.post_turn({"input": f"turn {index}"}).json()["turn_id"] for index in range(TURNS * 2)]
        turns = [system.wait_turn(turn_id, seconds=120) for turn_id in ids]
    finally:
        sampler.stop()
    # Then every turn completed on the connections it keeps open: no backend was started for one
    # transaction and ended after it (each a fork and a cold cache in PostgreSQL: an overflow
    # connection under load, 2.5 ms of PostgreSQL's CPU per turn)
    assert [turn["status"] for turn in turns] == ["completed"] * (TURNS * 2)
    kept = DEFAULT_POOLS[ProcessKind.WORKER].size
    assert 1 <= len(sampler.backends) <= kept, (sampler.backends, worker.log()[-2000:])


class _ConnectionSampler:
    """Counts a role's rows in ``pg_stat_activity`` every few milliseconds, keeping the most seen."""

    def __init__(self, database_url: str, role: str) -> None:
        self._url = _libpq(database_url)
        self._role = role
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.most = 0
        self.names: set[str] = set()
        self.backends: set[tuple[int, object]] = set()
        """Every backend of the role seen: its pid and start time."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.wait(0.005):
                rows = conn.execute(
                    "SELECT application_name, pid, backend_start FROM pg_stat_activity WHERE usename = %s",
                    (self._role,),
                ).fetchall()
                self.most = max(self.most, len(rows))
                self.names |= {str(row[0]) for row in rows}
                self.backends |= {(int(row[1]), row[2]) for row in rows}


def _libpq(url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
