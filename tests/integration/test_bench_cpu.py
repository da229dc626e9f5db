"""`aptix bench`'s CPU of PostgreSQL: a backend that ends during a measurement still counts (`bench.cpu`)."""

from __future__ import annotations

import time

import psycopg
import pytest

from aptix_cli.bench.cpu import CpuMeter, Group
from aptix_cli.bench.services import ScratchServices
from tests.services_check import database_admin_url, redis_url

pytestmark = pytest.mark.integration

_BURN = "SELECT count(*) FROM generate_series(1, 4000000) AS n WHERE n % 7 = 3"
"""A query that keeps its backend on the CPU for a few tenths of a second."""


def test_a_scratch_backend_that_ended_between_two_samples_counts_in_postgres_cpu(services: None) -> None:
    bench = ScratchServices(database_url=database_admin_url(), redis_url=redis_url())
    with bench as scratch:
        counted = CpuMeter([Group("postgres", bench.postgres_members, tree=True)])
        own_only = CpuMeter([Group("postgres", bench.postgres_members, tree=False)])
        before, before_own = counted.sample(), own_only.sample()

        # When a connection to the scratch database burns CPU and is closed (as a pool's overflow connection is)
        started = time.process_time()
        with psycopg.connect(scratch.dsn) as conn:
            pid = conn.info.backend_pid
            wall = time.perf_counter()
            conn.execute(_BURN).fetchone()
            wall = time.perf_counter() - wall
        _wait_until_gone(pid)
        assert time.process_time() - started < wall / 2  # the time was the backend's, not this process's

        after, after_own = counted.sample(), own_only.sample()

    # Then the postgres group counted as a tree has its CPU (reaped into the postmaster's children's time)
    used = counted.used(before, after)["postgres"]
    assert used >= wall * 0.5, (used, wall)
    # while counting each process's own time loses it (what the bench did before)
    assert own_only.used(before_own, after_own)["postgres"] < used - wall * 0.4


def _wait_until_gone(pid: int) -> None:
    """Wait until the backend ``pid`` has ended and the postmaster reaped it."""
    deadline = time.monotonic() + 10
    with psycopg.connect(database_admin_url(), autocommit=True) as admin:
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is not None:
            assert time.monotonic() < deadline, f"backend {pid} still runs"
            time.sleep(0.05)
    time.sleep(0.2)  # the postmaster reaps it on SIGCHLD
