"""Connection pools: each process kind's database pool, the settings that override it, the engine
they build (tests/integration/test_db_pool_bound.py counts a real worker's connections), and the
bounded turn-state Redis client."""

from __future__ import annotations

import contextlib

from sqlalchemy import Engine, event
from sqlalchemy.pool import QueuePool

from shared.db.engine import DEFAULT_POOLS, PoolSize, ProcessKind, engine_for, pool_size_for
from shared.settings import Settings

POSTGRES = "postgresql://aptix@127.0.0.1:5432/aptix"


def test_each_process_kind_has_a_default_pool_and_the_settings_override_it() -> None:
    assert pool_size_for(Settings(), ProcessKind.WORKER) == DEFAULT_POOLS[ProcessKind.WORKER] == PoolSize(3, 0)
    assert pool_size_for(Settings(), ProcessKind.GATEWAY).most == 8
    assert pool_size_for(Settings(db_pool_size=5), ProcessKind.WORKER) == PoolSize(5, 0)
    assert pool_size_for(Settings(db_max_overflow=0), ProcessKind.GATEWAY) == PoolSize(4, 0)


def test_engine_for_bounds_its_pool_and_names_its_connections() -> None:
    settings = Settings(database_url=POSTGRES, db_pool_size=3, db_max_overflow=2)
    engine = engine_for(settings, ProcessKind.WORKER, name="llm.w1@host", pre_ping=False)
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.size() == 3 and pool._max_overflow == 2  # what SQLAlchemy will enforce
    # every connection tells PostgreSQL whose it is (pg_stat_activity.application_name)
    assert _connect_args(engine) == {"application_name": "aptix-worker llm.w1@host"}


def _connect_args(engine: Engine) -> dict[str, object]:
    """The arguments the engine passes to psycopg's connect (the attempt is stopped there)."""
    captured: dict[str, object] = {}

    def record(_dialect: object, _record: object, _cargs: object, cparams: dict[str, object]) -> None:
        captured.update({k: v for k, v in cparams.items() if k == "application_name"})
        raise _Stop

    event.listen(engine, "do_connect", record)
    with contextlib.suppress(_Stop):
        engine.connect()
    return captured


class _Stop(Exception):
    """Stops a connection attempt once its arguments are seen."""


def test_the_turn_state_redis_client_waits_for_one_of_its_connections_past_the_limit() -> None:
    # An unbounded pool opens a connection per greenlet of a 2,000-slot llm worker; a plain bounded
    # one raises "Too many connections" at the limit. This one makes the command wait instead.
    from redis import BlockingConnectionPool

    from shared.state import RedisStateStore

    store = RedisStateStore.from_url("redis://127.0.0.1:6379/0", max_connections=7)
    pool = store.client.connection_pool
    assert isinstance(pool, BlockingConnectionPool) and pool.max_connections == 7
    assert Settings().redis_max_connections == 100
