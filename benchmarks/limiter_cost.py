"""What the shared model rate limits cost per model call: worker CPU µs, Redis round trips, Redis CPU µs.

Run from the repo root against a Redis (keys are prefixed with a random id and deleted afterwards)::

    .venv/bin/python benchmarks/limiter_cost.py                  # 20,000 calls per case
    .venv/bin/python benchmarks/limiter_cost.py --calls 100000 --redis-url redis://127.0.0.1:6379/0

Cases, each one model call's worth of limiter work on a ~6 KB composed request:

- Aptix (``workers.llm.limiter``): ``pace`` before the call (its token estimate included) and
  ``settle`` after, with no limits (a 429 pause is still checked), with ``rpm``, and with ``rpm`` +
  ``tpm`` (the answer's usage differs from the estimate, so settling is a second round trip); and a
  call held back (``pace`` answering a wait).
- The ``limits`` package's Redis storage, when it is importable (it is no dependency of Aptix: to
  compare, install ``limits[redis]`` in a scratch venv and put its site-packages on ``PYTHONPATH``):
  a moving window and a sliding-window counter, ``hit`` on an rpm item and, for rpm + tpm, on a tpm
  item with the estimate as cost; a held-back call also needs ``get_window_stats`` for its wait.

Each case runs ``--calls`` times in all, in ``--rounds`` interleaved rounds; the figures are the
rounds' medians. Worker CPU is this process's CPU time (``time.process_time``); round trips are responses read from
Redis (a counting connection class); Redis CPU is the server's ``used_cpu_user + used_cpu_sys`` from
``INFO cpu`` (noisy: the server is shared). Limits are set so high that nothing is held back, except
in the "held back" cases. "burst from idle" is how many of 400 calls made at once a limit of 300 a
minute lets through: the spreading the issue's one-second test needs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

ROUND_TRIPS = [0]
"""Responses read from Redis by this process (one per command; a pipeline's count as one each)."""


class _CountingConnection(redis.Connection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        ROUND_TRIPS[0] += 1
        return super().read_response(*args, **kwargs)


def main() -> int:
    """Measure every case and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7, help="each case is measured this often, interleaved; medians")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    pool = redis.ConnectionPool.from_url(args.redis_url, connection_class=_CountingConnection)
    client = redis.Redis(connection_pool=pool)
    prefix = f"bench-limiter-{uuid.uuid4().hex[:8]}"
    print(f"{'case':58} {'worker CPU µs':>13} {'round trips':>11} {'Redis CPU µs':>12}  burst from idle")
    try:
        cases = [*_aptix_cases(client, prefix), *_limits_cases(args.redis_url, prefix)]
        figures: list[list[tuple[float, float, float]]] = [[] for _ in cases]
        for _ in range(args.rounds):  # interleaved, so a busy moment of a shared machine hits every case
            for index, (_, per_call, _) in enumerate(cases):
                figures[index].append(_measure(client, per_call, max(1, args.calls // args.rounds)))
        for (name, _, burst), rounds in zip(cases, figures, strict=True):
            cpu, trips, server = (statistics.median(column) for column in zip(*rounds, strict=True))
            print(f"{name:58} {cpu:13.1f} {trips:11.2f} {server:12.1f}  {burst}")
    finally:
        for key in client.scan_iter(f"*{prefix}*"):
            client.delete(key)
    return 0


Case = tuple[str, Callable[[], None], str]


def _aptix_cases(client: redis.Redis, prefix: str) -> list[Case]:
    from workers.llm.limiter import Limits, RateLimiter, estimate_tokens

    def limiter(label: str, limits: Limits) -> RateLimiter:
        return RateLimiter(client, name=f"{prefix}:{label}:b", pause_name=f"{prefix}:{label}:p", limits=limits)

    request = _request()
    cases: list[Case] = []
    for label, limits in [
        ("no limits (pause check only)", Limits()),
        ("rpm", Limits(rpm=10**9)),
        ("rpm + tpm (estimate settled with usage)", Limits(rpm=10**9, tpm=10**12)),
    ]:
        bucket = limiter(label, limits)

        def call(bucket: RateLimiter = bucket) -> None:
            slot = bucket.pace(request)
            bucket.settle(slot, used=1234)

        burst = _aptix_burst(limiter("burst", Limits(rpm=300))) if label == "rpm" else ""
        cases.append((f"aptix GCRA: {label}", call, burst))
    held = limiter("held", Limits(rpm=1, tpm=10**12))
    held.pace(request)
    cases.append(("aptix GCRA: a call held back (pace answers its slot)", lambda: _discard(held.pace(request)), ""))
    estimate = ("  of which the token estimate (JSON of the 6 KB request)", lambda: _discard(estimate_tokens(request)))
    cases.append((*estimate, ""))
    return cases


def _limits_cases(redis_url: str, prefix: str) -> list[Case]:
    try:
        from limits import parse
        from limits.storage import RedisStorage
        from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter
    except ImportError:
        print("(limits is not importable: its cases are left out; see this script's docstring)")
        return []
    from workers.llm.limiter import estimate_tokens

    pool = redis.ConnectionPool.from_url(redis_url, connection_class=_CountingConnection)
    storage = RedisStorage(redis_url, connection_pool=pool)
    request = _request()
    cases: list[Case] = []
    strategies: list[tuple[str, Any]] = [("moving window", MovingWindowRateLimiter)]
    strategies.append(("sliding window", SlidingWindowCounterRateLimiter))
    for label, strategy in strategies:
        limiter = strategy(storage)
        rpm, tpm = parse("1000000000/minute"), parse("1000000000000/minute")
        key = f"{prefix}-{label.replace(' ', '-')}"

        def rpm_only(limiter: Any = limiter, rpm: Any = rpm, key: str = key) -> None:
            limiter.hit(rpm, key, "rpm")

        def both(limiter: Any = limiter, rpm: Any = rpm, tpm: Any = tpm, key: str = key) -> None:
            limiter.hit(rpm, key, "rpm2")
            limiter.hit(tpm, key, "tpm", cost=estimate_tokens(request))  # as a worker would, each call

        full = parse("1/minute")
        limiter.hit(full, key, "held")

        def held(limiter: Any = limiter, full: Any = full, key: str = key) -> None:
            if not limiter.hit(full, key, "held"):
                limiter.get_window_stats(full, key, "held")

        burst = _limits_burst(strategy(storage), key + "-burst")
        cases.append((f"limits {label}: rpm", rpm_only, burst))
        if strategy is SlidingWindowCounterRateLimiter:  # a moving window pushes one list entry per token
            cases.append((f"limits {label}: rpm + tpm (no settling possible)", both, ""))
        cases.append((f"limits {label}: a call held back (+ get_window_stats)", held, ""))
    return cases


def _measure(client: redis.Redis, per_call: Callable[[], None], calls: int) -> tuple[float, float, float]:
    for _ in range(200):  # warm up: scripts loaded, connection open
        per_call()
    server_before = _server_cpu(client)
    trips_before = ROUND_TRIPS[0]
    started = time.process_time()
    for _ in range(calls):
        per_call()
    cpu = time.process_time() - started
    trips = ROUND_TRIPS[0] - trips_before
    server = _server_cpu(client) - server_before
    return cpu / calls * 1e6, trips / calls, server / calls * 1e6


def _aptix_burst(limiter: Any) -> str:
    now = time.time()
    return str(sum(1 for _ in range(400) if limiter.acquire(0, now=now).wait == 0))


def _limits_burst(limiter: Any, key: str) -> str:
    from limits import parse

    item = parse("300/minute")
    return str(sum(1 for _ in range(400) if limiter.hit(item, key)))


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _request() -> dict[str, Any]:
    """A composed request of about 6 KB: instructions, ten history messages, three tools."""
    words = "the quick brown fox jumps over the lazy dog " * 7
    tool = {"type": "function", "name": "lookup", "description": words, "strict": False,
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}  # fmt: skip
    return {
        "model": "gpt-4.1-mini",
        "instructions": words * 2,
        "input": [{"type": "message", "role": "user" if i % 2 else "assistant", "content": words} for i in range(10)],
        "tools": [{**tool, "name": f"lookup_{i}"} for i in range(3)],
        "store": False,
    }


def _discard(_: object) -> None:
    pass


if __name__ == "__main__":
    raise SystemExit(main())
