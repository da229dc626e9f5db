"""``aptix bench``: a small real run of the production shape on the test services."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from tests.services_check import database_admin_url, redis_url
from tests.support.redis_cluster import LocalRedisCluster

pytestmark = pytest.mark.integration


@pytest.mark.timeout(420)
def test_bench_measures_plain_turns_and_the_bare_chain_and_removes_its_data(services: None) -> None:
    # When a small plain run goes through one gateway and one aptix worker
    done = _bench("--scenario", "plain", "--turns", "20", "--workers", "1", "--rss")
    out = done.stdout

    # Then it succeeds and prints the hops the turns ran, the CPU of every group and the bare chain
    assert done.returncode == 0, out + done.stderr
    # (by default a task per call: the entry's task makes the model call and runs the reasoner and the persistence)
    assert re.search(r"task boundaries:\s+call \(APTIX_TASK_BOUNDARIES\)", out), out
    assert re.search(r"hops per turn:\s+1 \(20 sampled turns; entry\)", out), out
    assert re.search(r"statuses:\s+completed 20\n", out), out
    for group in ("gateway", "workers", "redis", "postgres", "total"):
        assert re.search(rf"CPU per turn, ms:.*\b{group} [0-9.]+", out), out
    assert "plain: 20 chains of 1 hop (llm)" in out, out
    assert re.search(r"CPU per chain, ms:\s+workers [0-9.]+ \| redis [0-9.]+ \| total", out), out
    # and what the servers did per turn by their own counters: Redis's commands and CPU, PostgreSQL's commits
    assert re.search(r"Redis state\+broker:\s+per turn [0-9.]+ commands \(\w+ [0-9.]+.*\), CPU [0-9.]+ ms", out), out
    assert re.search(r"PostgreSQL:\s+per turn [0-9.]+ transactions committed", out), out
    # and, asked with --rss, the workers' memory at the start, along the run and at its end
    assert re.search(r"workers' RSS along:\s+0: [1-9]\d*, (.*, )?20: [1-9]\d* \(turns finished: MB\)", out), out

    # And its scratch database is gone and its Redis databases hold nothing of the run
    database = re.search(r"scratch database (aptix_bench_\w+)", out)
    dbs = re.search(r"\(db (\d+) state, db (\d+) broker\)", out)
    assert database and dbs, out
    with psycopg.connect(database_admin_url()) as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database.group(1),)).fetchone() is None
    base = redis_url().rstrip("/")
    for index in dbs.groups():
        client = redis.Redis.from_url(f"{base}/{index}")
        assert not client.keys("aptix:turn:*") and not client.exists("aptix:bench:bare:done")


@pytest.mark.timeout(420)
def test_bench_with_queue_boundaries_counts_the_hops_the_workers_ran_and_chains_as_many(services: None) -> None:
    # When a small server-tool run's workers end a task only where the queue changes
    done = _bench("--scenario", "server-tool", "--turns", "20", "--workers", "1", "--task-boundaries", "queue")
    out = done.stdout

    # Then the bench says so, its turns ran 7 hops each, and its bare chain runs those 7
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"task boundaries:\s+queue \(APTIX_TASK_BOUNDARIES\)", out), out
    hops = "entry > llm_call > reasoner > execute_server_tools > reasoner > llm_call > reasoner"
    assert re.search(rf"hops per turn:\s+7 \(20 sampled turns; {hops}\)", out), out
    assert re.search(r"statuses:\s+completed 20\n", out), out
    chain = "pipeline > llm > pipeline > tools > pipeline > llm > pipeline"
    assert f"server-tool: 20 chains of 7 hops ({chain})" in out, out


@pytest.mark.timeout(1200)
def test_bench_peers_run_the_server_tool_turn_beside_aptix_and_the_bare_chain(services: None) -> None:
    # When a small server-tool run goes through one gateway and one aptix worker, then through each peer
    # (their virtualenvs in the checkout's shared cache, .venv-peers: the first run installs them)
    done = _bench("--peers", "--scenario", "server-tool", "--turns", "20", "--workers", "1", timeout=1100)
    out = done.stdout

    # Then every turn of every system completed and each peer's CPU counts its process and its backends
    assert done.returncode == 0, out + done.stderr
    for peer in ("DBOS Transact, 3 steps", "LangGraph + Postgres saver"):
        block = re.search(rf"^{re.escape(peer)}: 20 server-tool turns in one process\n(.*\n){{3}}", out, re.MULTILINE)
        assert block, out
        assert re.search(r"CPU per turn, ms:\s+peer [0-9.]+ \| postgres [0-9.]+ \| total [0-9.]+", block.group(0)), out
        assert re.search(r"completed:\s+20 of 20", block.group(0)), out
    # and the table puts them beside Aptix and the bare chain, each row with its numbers
    row = r"[0-9.]+\s+[0-9.]+x\s+[0-9.]+\s+(?:[0-9.]+|n/a)\s+[0-9.]+x\s+[0-9.]+x"
    for system in ("Aptix", "bare Celery chain", "DBOS Transact, 3 steps", "LangGraph + Postgres saver"):
        assert re.search(rf"^  {re.escape(system)}\s+{row}$", out, re.MULTILINE), out

    # And the peers' scratch databases are gone with the bench's own
    database = re.search(r"scratch database (aptix_bench_\w+)", out)
    assert database, out
    with psycopg.connect(database_admin_url()) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (database.group(1) + "%",))
        assert left.fetchall() == []


@pytest.mark.timeout(420)
def test_bench_two_orgs_reports_both_organisations_and_interactive_turns(services: None) -> None:
    # When two organisations' small batches run side by side through one gateway and one aptix worker
    done = _bench("--two-orgs", "--turns", "60", "--workers", "1", env={"APTIX_ORG_MAX_IN_FLIGHT": "4"})
    out = done.stdout
    # Then every turn completed and it printed each organisation's figures and the interactive latencies
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"org A:\s+first turn completed [0-9.]+ s after its batch was accepted, all done", out), out
    assert re.search(r"org B:\s+first turn completed [0-9.]+ s after its batch was accepted, all done", out), out
    assert re.search(r"interactive turns of A:\s+created to completed p50 \d+ ms", out), out


@pytest.mark.timeout(420)
def test_bench_openai_batch_runs_a_file_end_to_end_and_prints_its_figures(services: None) -> None:
    # When a small file goes through the Files and Batch API on one gateway and one aptix worker
    done = _bench("--openai-batch", "--turns", "80", "--workers", "1")
    out = done.stdout
    # Then every request completed and each figure was printed
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"create answered:\s+\d+ ms, validating", out), out
    for label in ("upload", "validation done", "first request completed", "turns/s", "files written", "download"):
        assert re.search(rf"{label}:\s+\S", out), out
    assert re.search(r"download:\s+\d+ MB, 80 lines", out), out
    written = r"files written:\s+[\d.]+ s after the last request ended \(the job writing them: [\d.]+ s\)"
    assert re.search(written, out), out


@pytest.mark.timeout(420)
def test_bench_with_the_state_store_on_a_cluster_counts_state_and_broker_apart(services: None, tmp_path: Path) -> None:
    # Given a Redis Cluster of three primaries for the state store, the broker on the test Redis
    cluster = LocalRedisCluster(tmp_path, replicas=0)
    try:
        cluster.start()
        # When a small plain run goes through it
        done = _bench("--scenario", "plain", "--turns", "20", "--workers", "1", "--state-url", cluster.url)
        out = done.stdout
        # Then the turns complete, and the state store's figures (summed over the nodes) and the broker's are apart
        assert done.returncode == 0, out + done.stderr
        assert re.search(r"statuses:\s+completed 20\n", out), out
        assert "state on a Redis Cluster of 3 nodes" in out, out
        assert re.search(r"Redis state:\s+per turn [0-9.]+ commands \(.*evalsha [0-9.]+.*\), CPU [0-9.]+ ms", out), out
        assert re.search(r"Redis broker:\s+per turn [0-9.]+ commands", out), out
        # and nothing of the run is left on the cluster
        client = cluster.client()
        assert list(client.scan_iter(match="aptix:*")) == []
        client.close()
    finally:
        cluster.stop()


def _bench(*args: str, timeout: int = 400, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``aptix bench ARGS`` on the test services, with no ``APTIX_*`` setting but ``env``'s."""
    return subprocess.run(
        [sys.executable, "-m", "aptix_cli", "bench", *args, "--redis-url", redis_url(),
         "--database-url", database_admin_url()],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("APTIX_")}, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
