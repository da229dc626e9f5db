"""What concurrent turn event streams cost one gateway process: memory and CPU per stream.

Issue 13: "500 concurrent event streams on one gateway process: memory and CPU per stream". This
starts ``aptix gateway`` (a scratch SQLite database, an empty Redis database it claims and flushes
afterwards, no workers), records ``--streams`` turns, opens one ``GET /v1/turns/{id}/events`` stream
per turn over raw sockets, and then plays the workers' part itself: it appends events to the turns'
Redis Streams (``XADD``, as a state save does) and reads what every stream delivers. Run from the
repo root::

    .venv/bin/python benchmarks/event_streams.py                         # 500 streams
    .venv/bin/python benchmarks/event_streams.py --streams 100 --events 50

Phases, each measured on the gateway process alone (``/proc/<pid>``: RSS, utime + stime):

- connected: RSS before any stream, and once all are open (headers received) and their replay done;
- idle: ``--idle`` seconds with nothing to send but keep-alive comments (``--keepalive``, default 5 s
  so an idle phase sees several);
- active: ``--events`` text deltas per stream appended round-robin at ``--rate`` events/s in all,
  each stamped with the time it was appended, so every client measures delivery latency;
- end: a ``turn.completed`` per turn; every stream must end with exactly the events appended.

Printed: RSS per stream, CPU per idle stream, CPU per event delivered, latency p50/p99/max, the
Redis connections the gateway held. Figures depend on the machine; this prints them and asserts
only that every event arrived once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

_OWNER_KEY = "aptix:bench:owner"


@dataclass
class Stream:
    """What one client stream received."""

    turn_id: str
    status: str = ""
    events: int = 0
    keepalives: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    ended: bool = False
    buffer: bytes = b""


@dataclass
class Sample:
    """The gateway process at one moment."""

    at: float
    cpu_s: float
    rss_bytes: int


def main() -> int:
    """Run the measurement and print the figures."""
    args = _arguments()
    allow_open_files(2 * args.streams + 512)
    import redis

    database = _claim_database(redis, args.redis_base)
    redis_url = f"{args.redis_base.rstrip('/')}/{database}"
    try:
        with tempfile.TemporaryDirectory(prefix="aptix-event-streams-") as scratch:
            from aptix_cli.launcher import ProcessGroup

            key = secrets.token_hex(16)
            env = {
                "APTIX_DATABASE_URL": f"sqlite:///{scratch}/bench.sqlite",
                "APTIX_REDIS_URL": redis_url,
                "APTIX_BROKER_URL": redis_url,
                "APTIX_API_KEYS": f"{key}:bench-org:bench-user",
                "APTIX_EVENTS_MAX_STREAMS": str(args.streams),
                "APTIX_EVENTS_KEEPALIVE_SECONDS": str(args.keepalive),
                "APTIX_HTTP_MAX_CONNECTIONS": str(args.streams + 256),
                "APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT": "0",
            }
            group = ProcessGroup(env, log_dir=Path(scratch))
            subprocess.run(
                [sys.executable, "-m", "aptix_cli", "db", "upgrade"], env=group.env, check=True, capture_output=True
            )
            try:
                process, url = group.start_gateway()
                return asyncio.run(_measure(args, url, key, process.pid, redis_url))
            finally:
                group.stop_all()
    finally:
        redis.Redis.from_url(redis_url).flushdb()


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--events", type=int, default=20, help="text deltas per stream in the active phase")
    parser.add_argument("--rate", type=float, default=2000.0, help="events appended per second, in all")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle phase")
    parser.add_argument("--keepalive", type=float, default=5.0, help="APTIX_EVENTS_KEEPALIVE_SECONDS of the gateway")
    parser.add_argument("--redis-base", default="redis://127.0.0.1:6379", help="Redis (an empty database is claimed)")
    return parser.parse_args()


async def _measure(args: argparse.Namespace, url: str, key: str, pid: int, redis_url: str) -> int:
    import httpx
    import redis.asyncio as aioredis

    host, port = url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        limit = asyncio.Semaphore(16)

        async def record(index: int) -> str:
            async with limit:
                response = await http.post("/v1/turns", json={"input": f"bench {index}"})
                response.raise_for_status()
                return str(response.json()["turn_id"])

        turn_ids = await asyncio.gather(*(record(index) for index in range(args.streams)))
    streams = [Stream(turn_id) for turn_id in turn_ids]
    before = _sample(pid)

    readers = [asyncio.create_task(_read(host, int(port), key, stream)) for stream in streams]
    await _until(lambda: all(stream.status for stream in streams), seconds=120)
    refused = [stream.status for stream in streams if stream.status != "200"]
    connected = _sample(pid)

    await asyncio.sleep(args.idle)
    idle = _sample(pid)

    client = aioredis.Redis.from_url(redis_url)
    redis_clients = int((await client.info("clients"))["connected_clients"])
    appended = await _append(client, turn_ids, events=args.events, rate=args.rate)
    await _until(lambda: sum(s.events for s in streams) >= appended or any(r.done() for r in readers), seconds=120)
    active = _sample(pid)
    pipe = client.pipeline(transaction=False)
    for turn_id in turn_ids:
        pipe.xadd(f"aptix:turn:{turn_id}:events", {"event": "turn.completed", "data": json.dumps({"status": "done"})})
    await pipe.execute()
    await asyncio.wait(readers, timeout=60)
    await client.aclose()

    _report(args, streams, refused, before, connected, idle, active, appended=appended, redis_clients=redis_clients)
    return 0 if all(stream.ended and stream.events == args.events for stream in streams) and not refused else 1


async def _read(host: str, port: int, key: str, stream: Stream) -> None:
    """One client: an HTTP/1.0 request (the body then ends with the connection, no chunk framing)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET /v1/turns/{stream.turn_id}/events HTTP/1.0\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    stream.status = head.split(b" ", 2)[1].decode()
    while chunk := await reader.read(65536):
        stream.buffer += chunk
        *frames, stream.buffer = stream.buffer.split(b"\n\n")
        now = time.time()
        for frame in frames:
            if frame.startswith(b":"):
                stream.keepalives += 1
            elif b"event: output_text.delta" in frame:
                stream.events += 1
                data = json.loads(frame.rsplit(b"data: ", 1)[1])
                stream.latencies_ms.append((now - data["t"]) * 1000)
            elif b"event: turn.completed" in frame:
                stream.ended = True
    writer.close()


async def _append(client: object, turn_ids: list[str], *, events: int, rate: float) -> int:
    """Append ``events`` deltas per turn, round-robin, in batches paced to ``rate`` per second."""
    batch = max(1, int(rate / 50))
    order = [turn_id for _ in range(events) for turn_id in turn_ids]
    started = time.monotonic()
    for offset in range(0, len(order), batch):
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        for turn_id in order[offset : offset + batch]:
            data = json.dumps({"delta": "word ", "t": time.time()})
            pipe.xadd(f"aptix:turn:{turn_id}:events", {"event": "output_text.delta", "data": data})
        await pipe.execute()
        ahead = started + (offset + batch) / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    return len(order)


async def _until(condition: object, *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.05)


def _sample(pid: int) -> Sample:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return Sample(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), rss)


def _report(
    args: argparse.Namespace,
    streams: list[Stream],
    refused: list[str],
    before: Sample,
    connected: Sample,
    idle: Sample,
    active: Sample,
    *,
    appended: int,
    redis_clients: int,
) -> None:
    count = len(streams)
    mib = 1024 * 1024
    print(f"{count} event streams on one gateway process (pid RSS and CPU from /proc)")
    if refused:
        print(f"  REFUSED: {len(refused)} streams ({sorted(set(refused))})")
    per_stream_kib = (connected.rss_bytes - before.rss_bytes) / count / 1024
    print(
        f"  RSS: {before.rss_bytes / mib:.1f} MiB before, {connected.rss_bytes / mib:.1f} MiB with {count} streams "
        f"open ({per_stream_kib:.0f} KiB per stream), {active.rss_bytes / mib:.1f} MiB after the active phase"
    )
    print(
        f"  opening them: {connected.cpu_s - before.cpu_s:.2f} s CPU "
        f"({(connected.cpu_s - before.cpu_s) / count * 1000:.2f} ms per stream)"
    )
    idle_s = idle.at - connected.at
    idle_cpu = idle.cpu_s - connected.cpu_s
    keepalives = sum(stream.keepalives for stream in streams)
    print(
        f"  idle {idle_s:.0f} s (keep-alive every {args.keepalive:g} s, {keepalives} sent): {idle_cpu:.2f} s CPU, "
        f"{idle_cpu / idle_s * 100:.1f} % of a core, {idle_cpu / idle_s / count * 1e6:.0f} us per stream per second"
    )
    delivered = sum(stream.events for stream in streams)
    active_s = active.at - idle.at
    active_cpu = active.cpu_s - idle.cpu_s
    print(
        f"  active {active_s:.1f} s: {appended} events appended, {delivered} delivered "
        f"({delivered / active_s:.0f}/s): {active_cpu:.2f} s CPU, {active_cpu / active_s * 100:.0f} % of a core, "
        f"{active_cpu / max(delivered, 1) * 1e6:.0f} us per event"
    )
    latencies = sorted(latency for stream in streams for latency in stream.latencies_ms)
    if latencies:
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"  delivery latency (XADD to client): p50 {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms, "
            f"max {latencies[-1]:.1f} ms"
        )
    ended = sum(stream.ended for stream in streams)
    exact = sum(stream.events == args.events for stream in streams)
    print(f"  ended with turn.completed: {ended}/{count}; received exactly {args.events} deltas: {exact}/{count}")
    print(f"  Redis connections (all clients, the bench's included) during the run: {redis_clients}")


def _claim_database(redis_module: object, base: str) -> int:
    """An empty Redis database, marked as this run's (as the tests claim theirs)."""
    for index in range(15, 0, -1):
        client = redis_module.Redis.from_url(f"{base.rstrip('/')}/{index}")  # type: ignore[attr-defined]
        if client.dbsize() == 0 and client.set(_OWNER_KEY, "bench", nx=True, ex=3600) and client.dbsize() == 1:
            return index
    raise SystemExit(f"no empty Redis database at {base}")


if __name__ == "__main__":
    raise SystemExit(main())
