"""What streaming a model call costs a worker: CPU per call, whole vs streamed, and per relayed text delta.

A turn that streams reads the model's answer as server-sent events and appends its text to the turn's
event log (Redis, one ``XADD`` + ``EXPIRE`` round trip per append, :mod:`workers.text_relay`). This
measures, in this process, with the scripted model in a child process (its CPU is not counted) and a
real Redis::

    .venv/bin/python benchmarks/stream_relay.py                        # 120 deltas a call, 5 ms apart
    .venv/bin/python benchmarks/stream_relay.py --words 300 --drip-ms 10 --calls 20 --concurrency 10

- one append to the event log (CPU and wall time);
- a call read whole (``create``), streamed into a no-op sink, and streamed with the relay appending
  every delta or batching them ``--flush-ms`` apart: worker CPU per call and event-log appends per call.

``--drip-ms`` is the model's pace between two stream events (a model writing 50-100 tokens a second
sends a delta every 10-20 ms); at 0 every delta arrives at once and batching folds them all together.
Needs Redis at ``$APTIX_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``; the keys it writes are deleted).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shared.turn_events import RedisTurnEventLog  # noqa: E402
from workers.llm.client import ResponsesClient  # noqa: E402
from workers.text_relay import TextRelay  # noqa: E402


def main() -> int:
    """Measure and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=120, help="words in the answer (one delta each)")
    parser.add_argument("--drip-ms", type=float, default=5.0, help="the model's pause between two events")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--flush-ms", type=float, nargs="*", default=[20.0, 50.0])
    parser.add_argument("--appends", type=int, default=20_000)
    args = parser.parse_args()
    client = redis.Redis.from_url(os.environ.get("APTIX_REDIS_URL", "redis://127.0.0.1:6379/0"))
    log = RedisTurnEventLog(client, ttl_seconds=600, max_events=10_000)
    _append_cost(client, log, args.appends)
    port = _free_port()
    model = subprocess.Popen([sys.executable, "-m", "scripted_llm", "--port", str(port)], cwd=ROOT)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/__scripted/healthz")
        llm = ResponsesClient(base_url=f"http://127.0.0.1:{port}/v1", api_key="")
        text = " ".join(f"word{n}" for n in range(args.words))
        request = {"model": "m", "input": f"[[say:{text}]] [[drip:{args.drip_ms:g}]]"}
        print(f"a call: {args.words} deltas, {args.drip_ms:g} ms apart; {args.calls} calls, {args.concurrency} at once")
        _calls(args, "read whole (create)", lambda: llm.create(request) and 0)
        _calls(args, "streamed, no relay", lambda: llm.stream(request, lambda _delta: None) and 0)
        for flush_ms in (0.0, *args.flush_ms):
            label = "streamed, relay every delta" if flush_ms == 0 else f"streamed, relay batched {flush_ms:g} ms"
            _calls(args, label, lambda flush_ms=flush_ms: _relayed(llm, request, log, client, flush_ms / 1000))
        llm.close()
    finally:
        model.terminate()
        model.wait(10)
    return 0


def _append_cost(client: redis.Redis, log: RedisTurnEventLog, appends: int) -> None:
    turn_id = f"bench-{uuid.uuid4().hex}"
    for _ in range(200):
        log.append(turn_id, "output_text.delta", {"delta": " word"})
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(appends):
        log.append(turn_id, "output_text.delta", {"delta": " word"})
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    client.delete(f"aptix:turn:{turn_id}:events")
    print(f"one event-log append (XADD+EXPIRE): {cpu / appends * 1e6:.0f} µs CPU, {wall / appends * 1e6:.0f} µs wall")


def _relayed(llm: ResponsesClient, request: dict[str, str], log: RedisTurnEventLog, client: redis.Redis,
             flush_seconds: float) -> int:  # fmt: skip
    turn_id = f"bench-{uuid.uuid4().hex}"
    relay = TextRelay(log, turn_id, flush_seconds=flush_seconds)
    llm.stream(request, relay)
    relay.finish()
    appended = int(client.xlen(f"aptix:turn:{turn_id}:events"))
    client.delete(f"aptix:turn:{turn_id}:events")
    return appended


def _calls(args: argparse.Namespace, label: str, call: object) -> None:
    assert callable(call)
    call()  # warm up: a connection, the code paths
    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        appends = list(pool.map(lambda _n: call(), range(args.calls)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"  {label:34s} {cpu / args.calls * 1e3:6.2f} ms CPU per call, "
        f"{sum(appends) / args.calls:6.1f} appends per call ({wall:.1f} s wall)"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"the scripted model did not answer at {url}")


if __name__ == "__main__":
    raise SystemExit(main())
