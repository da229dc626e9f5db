"""What organisations' own limits cost at the gateway, and whether one organisation over its rpm disturbs
another's turns (issue 27). Run from the repo root with Redis and PostgreSQL up::

    .venv/bin/python benchmarks/org_limits_cost.py                    # 3 x 2,000 requests per case, 20 s flood
    .venv/bin/python benchmarks/org_limits_cost.py --requests 5000 --flood-seconds 60

It makes a scratch PostgreSQL database and claims two Redis databases as the tests do
(``tests.support``), starts the scripted model, one ``aptix gateway`` and one ``aptix worker``, then:

1. **CPU per request**: ``GET /v1/modes`` (authenticated, no database or Redis work of its own) over one
   kept-alive connection, for an organisation without limits of its own and for one with ``--rpm``
   (set high, so every request is counted in Redis and none refused), in interleaved rounds. The
   gateway's CPU time is read from ``/proc/<pid>/stat`` (user + system) before and after each round.
2. **The other organisation's turns**: org ``other`` runs ``--turns`` turns one after another
   (``POST /v1/turns?wait=30``) while idle, then again while org ``flood`` (``--rpm 60``) sends ten times
   its limit (10 requests a second) from 4 threads, measured from its first 429 on (its minute's allowance
   spent); printed: each phase's p50 and p95 latency, and how many of the flood's requests were answered
   202 and 429.

Figures depend on the machine; this prints them and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

KEYS = {"free": "bench-key-free", "rpm": "bench-key-rpm", "other": "bench-key-other", "flood": "bench-key-flood"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=100, help="turns of the other organisation per phase")
    parser.add_argument("--flood-rpm", type=int, default=60)
    args = parser.parse_args()

    from scripted_llm import ScriptedServer
    from tests.conftest import redis_databases
    from tests.integration.conftest import system_env
    from tests.support.databases import fresh_database
    from tests.support.stack import LocalStack

    modes = Path(__file__).resolve().parents[1] / "shared" / "modes" / "default_catalog.yaml"
    with ScriptedServer() as llm, fresh_database("aptix_bench_limits") as db, redis_databases(2) as urls:
        env = system_env(database_url=db, redis_urls=(urls[0], urls[1]), llm=llm, modes_file=modes)
        env["APTIX_API_KEYS"] = ",".join(f"{key}:{org}:u" for org, key in KEYS.items())
        stack = LocalStack(env)
        try:
            stack.start_worker("bench", concurrency=8)
            gateway, url = stack.start_gateway()
            aptix = [sys.executable, "-m", "aptix_cli", "orgs", "set"]
            full_env = {**os.environ, **env}
            subprocess.run([*aptix, "rpm", "--rpm", "10000000"], env=full_env, check=True, capture_output=True)
            subprocess.run([*aptix, "flood", "--rpm", str(args.flood_rpm)], env=full_env, check=True,
                           capture_output=True)  # fmt: skip
            time.sleep(2.5)  # every gateway reads the limits at most every 2 s
            _cpu(url, gateway.pid, args)
            _p95(url, args)
        finally:
            stack.stop_all()
    return 0


def _cpu(url: str, pid: int, args: argparse.Namespace) -> None:
    per_request: dict[str, list[float]] = {"free": [], "rpm": []}
    with httpx.Client(base_url=url, timeout=30) as client:
        for org in per_request:  # warm up
            for _ in range(200):
                client.get("/v1/modes", headers={"Authorization": f"Bearer {KEYS[org]}"})
        for _ in range(args.rounds):
            for org, seen in per_request.items():
                headers = {"Authorization": f"Bearer {KEYS[org]}"}
                before = cpu_seconds(pid)
                for _ in range(args.requests):
                    response = client.get("/v1/modes", headers=headers)
                    assert response.status_code == 200, response.text
                seen.append((cpu_seconds(pid) - before) / args.requests * 1e6)
    for org, seen in per_request.items():
        label = "no limit of its own" if org == "free" else "--rpm (one Redis round trip)"
        print(f"gateway CPU per GET /v1/modes, {label}: {statistics.median(seen):.0f} µs "
              f"(rounds: {', '.join(f'{v:.0f}' for v in seen)})")  # fmt: skip


def _turn_latencies(client: httpx.Client, count: int, tag: str) -> list[float]:
    headers = {"Authorization": f"Bearer {KEYS['other']}"}
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        response = client.post("/v1/turns", json={"input": f"{tag} {n}"}, headers=headers, params={"wait": 30})
        assert response.status_code == 200 and response.json()["status"] == "completed", response.text
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _p95(url: str, args: argparse.Namespace) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        _turn_latencies(client, 5, "warm")
        idle = _turn_latencies(client, args.turns, "idle")
        stop = threading.Event()
        statuses: list[int] = []
        interval = 60.0 / (10 * args.flood_rpm) * 4  # 4 threads: 10 x rpm a minute together

        def flood() -> None:
            headers = {"Authorization": f"Bearer {KEYS['flood']}"}
            with httpx.Client(base_url=url, timeout=60) as own:
                while not stop.is_set():
                    started = time.monotonic()
                    statuses.append(own.post("/v1/turns", json={"input": "flood"}, headers=headers).status_code)
                    stop.wait(max(0.0, interval - (time.monotonic() - started)))

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            while 429 not in statuses:  # the flood has used its minute: from here on it is refused
                time.sleep(0.1)
            accepted_before = statuses.count(202)
            during = _turn_latencies(client, args.turns, "during")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    for name, seen in (("idle", idle), ("while the other floods", during)):
        ordered = sorted(seen)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        print(f"other organisation's turns, {name}: p50 {statistics.median(seen):.0f} ms, p95 {p95:.0f} ms "
              f"({len(seen)} turns)")  # fmt: skip
    print(f"flood (rpm {args.flood_rpm}, sending 10x): {statuses.count(202)} accepted ({accepted_before} before the "
          f"measured turns), {statuses.count(429)} refused 429, "
          f"{len(statuses) - statuses.count(202) - statuses.count(429)} other")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
