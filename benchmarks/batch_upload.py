"""How long a 100,000-turn JSON Lines upload takes, and how much memory the gateway needs for it.

Issue 14, item 3: ``POST /v1/batches`` takes a JSON Lines upload (``Content-Type: application/jsonl``)
of up to 100,000 TurnRequests, streamed, never read into memory whole. Run from the repo root::

    .venv/bin/python benchmarks/batch_upload.py                               # 100,000 lines
    .venv/bin/python benchmarks/batch_upload.py --lines 20000 --redis-url redis://127.0.0.1:6391

What it does:

- creates a scratch PostgreSQL database (migrated) and claims two scratch Redis databases
  (``aptix_cli.bench.services``), all gone afterwards;
- starts ``aptix gateway`` on them as production runs it (its own process, the guarded h11 server,
  default upload limits); no worker runs, so the turns stay queued and their first messages wait in
  the broker, as a batch's do behind a busy pool;
- writes ``--lines`` TurnRequests to a temporary ``.jsonl`` file, then uploads it as ``aptix batch
  submit`` does: streamed from disk in 64 KiB chunks, chunked transfer encoding;
- prints the upload's size, the time from the first byte sent to the ``202`` (every line checked,
  every turn recorded in one transaction and its first message published), the rows recorded, and the
  gateway's resident memory before the upload (``VmRSS``) and its peak over its life (``VmHWM`` from
  ``/proc/PID/status``).

Figures depend on the machine; this prints them and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    """Run the measurement once and print it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000, help="TurnRequests in the upload (default 100000)")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    args = parser.parse_args()

    import httpx
    import psycopg

    from aptix_cli.bench.cpu import memory_kib
    from aptix_cli.bench.processes import BenchProcesses
    from aptix_cli.bench.services import ScratchServices

    key = "bench-upload-key"
    with ScratchServices(database_url=args.database_url, redis_url=args.redis_url) as scratch:
        env = {
            "APTIX_DATABASE_URL": scratch.database_url,
            "APTIX_REDIS_URL": scratch.state_url,
            "APTIX_BROKER_URL": scratch.broker_url,
            "APTIX_LLM_BASE_URL": "http://127.0.0.1:9/v1",
            "APTIX_LLM_API_KEY": "bench",
            "APTIX_API_KEYS": f"{key}:bench-org:bench-user",
        }
        processes = BenchProcesses(env)
        try:
            gateway, url = processes.start_gateway()
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "requests.jsonl"
                _write_requests(path, args.lines)
                size = path.stat().st_size
                before = memory_kib(gateway.pid)
                with (
                    httpx.Client(base_url=url, timeout=httpx.Timeout(1800, connect=10)) as client,
                    path.open("rb") as body,
                ):
                    started = time.perf_counter()
                    response = client.post(
                        "/v1/batches",
                        content=_chunks(body),
                        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/jsonl"},
                    )
                    elapsed = time.perf_counter() - started
            after = memory_kib(gateway.pid)
            if response.status_code != 202:
                sys.stderr.write(f"upload refused: {response.status_code} {response.text[:500]}\n")
                return 1
            batch = response.json()
            with psycopg.connect(scratch.dsn) as db:
                row = db.execute("SELECT count(*) FROM turns WHERE batch_id = %s", (batch["batch_id"],)).fetchone()
            recorded = int(row[0]) if row else 0
        finally:
            processes.stop_all()
    print(f"upload: {args.lines} lines, {size / 2**20:.1f} MiB")
    print(f"time to 202: {elapsed:.1f} s ({args.lines / elapsed:,.0f} turns/s)")
    print(f"batch {batch['batch_id']}: total {batch['total']}, turns recorded {recorded}")
    print(
        f"gateway memory: VmRSS before {before['VmRSS'] / 1024:.0f} MiB, after {after['VmRSS'] / 1024:.0f} MiB, "
        f"peak (VmHWM) {after['VmHWM'] / 1024:.0f} MiB"
    )
    return 0


def _write_requests(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for index in range(lines):
            request = {"input": f"bench upload request {index}: summarise this line", "metadata": {"n": str(index)}}
            out.write(json.dumps(request) + "\n")


def _chunks(body: BinaryIO, size: int = 64 * 1024) -> Iterator[bytes]:
    while chunk := body.read(size):
        yield chunk


if __name__ == "__main__":
    sys.exit(main())
