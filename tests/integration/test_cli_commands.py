"""The process commands of API.md: ``aptix db upgrade`` on a real database; ``aptix`` help."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, inspect

from shared.db.engine import normalise_database_url
from tests.services_check import database_admin_url

pytestmark = pytest.mark.integration


def test_db_upgrade_creates_every_table_when_the_database_is_empty(services: None) -> None:
    # Given an empty database
    name = f"aptix_cli_{uuid.uuid4().hex[:10]}"
    admin = database_admin_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0] + "/" + name
    try:
        # When `aptix db upgrade` runs (twice: it is idempotent)
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "aptix_cli", "db", "upgrade"],
                env={**os.environ, "APTIX_DATABASE_URL": url},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
        # Then the schema is there
        engine = create_engine(normalise_database_url(url))
        tables = set(inspect(engine).get_table_names())
        engine.dispose()
        assert {"sessions", "mode_history", "turns", "transcript_items", "provider_snapshots", "tool_runs"} <= tables
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_aptix_lists_its_commands() -> None:
    done = subprocess.run([sys.executable, "-m", "aptix_cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("gateway", "worker", "reconciler", "db", "demo"):
        assert command in done.stdout


def _bench(tmp_path: object, *args: str) -> subprocess.CompletedProcess[str]:
    """``aptix bench ARGS`` on the embedded services (no APTIX_* setting), in ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "aptix_cli", "bench", *args],
        env={k: v for k, v in os.environ.items() if not k.startswith("APTIX_")},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )


def test_embedded_bench_prints_its_figures(tmp_path: object) -> None:
    done = _bench(tmp_path, "--embedded", "--turns", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    for label in ("throughput:", "turns/s", "latency p50/p95:", "CPU per turn:", "completed 20"):
        assert label in done.stdout, done.stdout


def test_bench_recovery_costs_prints_the_cost_of_each_mechanism(tmp_path: object) -> None:
    done = _bench(tmp_path, "--recovery-costs", "--turns", "50")
    assert done.returncode == 0, done.stdout + done.stderr
    for label in ("checkpoint after a model answer", "started + outcome records", "still moving", "re-driven"):
        assert label in done.stdout, done.stdout
    assert "messages the stalled scan would have sent: 50" in done.stdout, done.stdout
