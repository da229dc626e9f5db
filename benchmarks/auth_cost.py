"""What authenticating a request costs the gateway: its CPU time per request, by kind of key.

Starts one ``aptix gateway`` process on a scratch PostgreSQL database (created from ``--database-url``,
dropped at the end), sends ``--requests`` sequential requests per case over one kept-alive
connection, and reads the gateway process's CPU time (``/proc/PID/stat``: user + system) before and
after each case. Cases, in rounds (``--rounds``; the median is printed):

- ``GET /healthz``: a request with no key (what the rest of a request costs);
- ``GET /v1/modes`` with a key of ``APTIX_API_KEYS``;
- ``GET /v1/modes`` with a database key (``aptix keys create``), remembered after its first use;
- ``GET /v1/modes`` with a key shaped like a database key that no key has (401, remembered as refused).

``--source DIR`` runs the gateway from another checkout's source (``git archive int2 | tar -x -C DIR``):
the code before database keys, which has no database key cases. Run from the repo root::

    .venv/bin/python benchmarks/auth_cost.py
    .venv/bin/python benchmarks/auth_cost.py --source /tmp/aptix-before

The gateway logs its access lines at INFO to a file, as in production; ``GET /v1/modes`` touches no
database or Redis, so the figures are the HTTP path, authentication and the route.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
ENV_KEY = "bench-env-key-0123456789abcdef"
_TICK = os.sysconf("SC_CLK_TCK")


def main() -> int:
    """Measure every case and print one line per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per case and round (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every case (default 3)")
    parser.add_argument("--source", type=Path, default=None, help="run the gateway from this source tree instead")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="given to the gateway; not used")
    args = parser.parse_args()
    name = f"aptix_auth_cost_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database_url = args.database_url.rsplit("/", 1)[0] + "/" + name
    try:
        return _run(args, database_url)
    finally:
        with psycopg.connect(args.database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(args: argparse.Namespace, database_url: str) -> int:
    from aptix_cli.launcher import free_port
    from shared.db.migrate import upgrade

    upgrade(database_url)
    source = args.source or ROOT
    cases: dict[str, tuple[str, str | None]] = {
        "no key (GET /healthz)": ("/healthz", None),
        "APTIX_API_KEYS key": ("/v1/modes", ENV_KEY),
    }
    if (source / "shared" / "api_keys.py").exists():
        cases["database key, remembered"] = ("/v1/modes", _database_key(database_url))
        cases["unknown aptix_ key (401)"] = ("/v1/modes", "aptix_" + "0" * 48)
    port = free_port()
    env = {
        **os.environ, "PYTHONPATH": str(source), "APTIX_DATABASE_URL": database_url, "APTIX_REDIS_URL": args.redis_url,
        "APTIX_API_KEYS": f"{ENV_KEY}:bench-org:bench-user",
    }  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="aptix-auth-cost-")) / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "aptix_cli", "gateway", "--port", str(port)], env=env, cwd=source,
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait(url, gateway)
        figures: dict[str, list[float]] = {case: [] for case in cases}
        with httpx.Client(base_url=url, timeout=30) as http:
            for path, key in cases.values():  # warm up: imports, first lookups, the connection
                _send(http, path, key, 200)
            for _ in range(args.rounds):
                for case, (path, key) in cases.items():
                    figures[case].append(_cpu_per_request(http, gateway.pid, path, key, args.requests))
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
    print(f"gateway from {source}, {args.requests} requests x {args.rounds} rounds per case; CPU per request:")
    for case, values in figures.items():
        spread = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {case:<28} {statistics.median(values):7.0f} µs   (rounds: {spread})")
    return 0


def _database_key(database_url: str) -> str:
    from datetime import UTC, datetime

    from shared.db import create_db_engine, session_factory
    from shared.db.api_keys import ApiKeyRepository

    engine = create_db_engine(database_url, pool_size=1, max_overflow=0)
    try:
        _, key = ApiKeyRepository(session_factory(engine)).create(
            org_id="bench-org", name="auth_cost", expires_at=None, now=datetime.now(UTC)
        )
    finally:
        engine.dispose()
    return key


def _cpu_per_request(http: httpx.Client, pid: int, path: str, key: str | None, requests: int) -> float:
    """The gateway's CPU microseconds per request over ``requests`` requests."""
    status = 200 if key is None or not key.startswith("aptix_0") else 401
    before = _cpu_seconds(pid)
    for _ in range(requests):
        _send(http, path, key, status)
    return (_cpu_seconds(pid) - before) / requests * 1e6


def _send(http: httpx.Client, path: str, key: str | None, status: int) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = http.get(path, headers=headers)
    if response.status_code != (401 if key and key.startswith("aptix_0") else status):
        raise SystemExit(f"{path}: {response.status_code} {response.text[:200]}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _wait(url: str, gateway: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise SystemExit("the gateway exited")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the gateway did not answer in 60 s")


if __name__ == "__main__":
    raise SystemExit(main())
