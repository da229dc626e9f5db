"""How long the gateway holds half-sent requests, and whether other clients are served meanwhile.

Issue 11 item 10: "half-sent requests stay open 75 s and more (no header/body read timeouts; 500
held 45 s)". This opens ``--connections`` raw connections to a gateway, each sending part of a
request and then nothing, and watches what the server does with them. Run from the repo root::

    .venv/bin/python benchmarks/slow_clients.py                          # 500 half request lines, 10 sources
    .venv/bin/python benchmarks/slow_clients.py --kind body               # 500 bodies that stop arriving
    .venv/bin/python benchmarks/slow_clients.py --sources 1               # all 500 from one address
    .venv/bin/python benchmarks/slow_clients.py --url http://127.0.0.1:8000   # a gateway already running

What it does:

- unless ``--url`` is given, starts ``aptix gateway`` on a free port with a scratch SQLite database
  (migrated first) and ``--redis-url`` (it only reads Redis here); ``APTIX_HTTP_*`` settings in the
  environment reach it;
- opens the connections from ``--sources`` loopback addresses (127.0.0.2, 127.0.0.3, ...), spread
  evenly, so the per-client connection cap can be measured apart from the read timeouts;
- each connection sends, by ``--kind``: ``idle`` nothing; ``headers`` half a request line
  (``GET /healthz HT``); ``body`` the headers of a ``POST /v1/turns`` with a valid key (``--key``;
  without one the gateway answers 401 before reading the body) declaring ``Content-Length: 1000``,
  and 10 bytes of it;
- meanwhile, every 0.25 s, a normal client on 127.0.0.1 sends ``GET /healthz`` on a new connection;
- it watches for ``--watch`` seconds, then closes whatever is still open.

Printed: how many connections the server refused at once (503 or closed within 1 s), answered
with a status (408, 503, ...) or closed silently later, and how many it still held at the end;
how long it held them (p50, max); the normal client's requests (ok/failed, p50, p99, max ms).
Figures depend on the machine; this prints them and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aptix_cli.open_files import allow_open_files  # noqa: E402  (after the path is set)

KINDS = ("idle", "headers", "body")


def payload(kind: str, key: str) -> bytes:
    """What each held connection sends before it falls silent."""
    if kind == "headers":
        return b"GET /healthz HT"
    if kind == "body":
        head = (
            "POST /v1/turns HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: 1000\r\n\r\n"
        )
        return head.encode() + b'{"input": '
    return b""


@dataclass
class Held:
    """One connection's fate."""

    opened: float
    closed: float | None = None
    status: str = ""
    """The status code the server answered with, or ``""`` (closed without a word, or still open)."""


@dataclass
class Probe:
    """The normal client's requests."""

    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def main() -> int:
    """Run the measurement and print the figures."""
    args = _arguments()
    allow_open_files(args.connections + 256)
    if args.url:
        return _report(args, asyncio.run(_measure(args, args.url, args.key or "")))
    with tempfile.TemporaryDirectory(prefix="aptix-slow-clients-") as scratch:
        from aptix_cli.launcher import ProcessGroup

        key = secrets.token_hex(16)
        env = {
            "APTIX_DATABASE_URL": f"sqlite:///{scratch}/bench.sqlite",
            "APTIX_REDIS_URL": args.redis_url,
            "APTIX_API_KEYS": f"{key}:bench-org:bench-user",
        }
        group = ProcessGroup(env, log_dir=Path(scratch))
        subprocess.run(
            [sys.executable, "-m", "aptix_cli", "db", "upgrade"], env=group.env, check=True, capture_output=True
        )
        try:
            _, url = group.start_gateway()
            return _report(args, asyncio.run(_measure(args, url, key)))
        finally:
            group.stop_all()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="a running gateway (default: start one)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="for the gateway this starts")
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--sources", type=int, default=10, help="loopback addresses to spread them over")
    parser.add_argument("--key", default=None, help="an API key of the --url gateway (for --kind body)")
    parser.add_argument("--kind", choices=KINDS, default="headers")
    parser.add_argument("--watch", type=float, default=90.0, help="seconds to watch them (default 90)")
    return parser.parse_args()


async def _measure(args: argparse.Namespace, url: str, key: str) -> tuple[list[Held], Probe, float]:
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    sources = [f"127.0.0.{2 + index % 250}" for index in range(args.sources)]
    started = time.monotonic()
    held = [Held(opened=started) for _ in range(args.connections)]
    probe = Probe()
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(_hold(host, int(port), sources[index % len(sources)], payload(args.kind, key), held[index]))
        for index in range(args.connections)
    ]
    prober = asyncio.create_task(_probe(host, int(port), probe, stop))
    _, pending = await asyncio.wait(watchers, timeout=args.watch)
    stop.set()
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, prober, return_exceptions=True)
    return held, probe, time.monotonic() - started


async def _hold(host: str, port: int, source: str, payload: bytes, record: Held) -> None:
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError as exc:
        record.closed, record.status = time.monotonic(), f"connect failed ({type(exc).__name__})"
        return
    record.opened = time.monotonic()
    try:
        writer.write(payload)
        received = b""
        while chunk := await reader.read(65536):
            received += chunk
        record.status = received.split(b" ", 2)[1].decode() if received.startswith(b"HTTP/") else ""
    except OSError:
        record.status = "reset"
    record.closed = time.monotonic()
    writer.close()


async def _probe(host: str, port: int, probe: Probe, stop: asyncio.Event) -> None:
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    while not stop.is_set():
        began = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=("127.0.0.1", 0)), 5)
            writer.write(request)
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            if answer.startswith(b"HTTP/1.1 200"):
                probe.latencies_ms.append((time.monotonic() - began) * 1000)
            else:
                probe.failures.append(answer[:12].decode(errors="replace") or "closed")
        except (OSError, TimeoutError) as exc:
            probe.failures.append(type(exc).__name__)
        await asyncio.sleep(0.25)


def _report(args: argparse.Namespace, measured: tuple[list[Held], Probe, float]) -> int:
    held, probe, elapsed = measured
    closed = [h for h in held if h.closed is not None]
    refused = [h for h in closed if h.closed is not None and h.closed - h.opened < 1.0]
    later = [h for h in closed if h not in refused]
    statuses = sorted({h.status or "silent" for h in closed})
    by_status = ", ".join(f"{s} x{sum((h.status or 'silent') == s for h in closed)}" for s in statuses)
    print(
        f"{args.connections} connections ({args.kind}) from {args.sources} source address(es), watched {elapsed:.0f}s"
    )
    print(
        f"  refused within 1 s: {len(refused)}; closed later: {len(later)}; still open at the end: "
        f"{len(held) - len(closed)}; answers: {by_status or 'none'}"
    )
    if later:
        seconds = sorted(h.closed - h.opened for h in later if h.closed is not None)
        print(f"  held before the server closed them: p50 {statistics.median(seconds):.1f}s, max {seconds[-1]:.1f}s")
    lat = sorted(probe.latencies_ms)
    if lat:
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"  normal client meanwhile: {len(lat)} ok, {len(probe.failures)} failed; "
            f"p50 {statistics.median(lat):.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms"
        )
    else:
        print(f"  normal client meanwhile: none served; failures: {probe.failures[:5]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
