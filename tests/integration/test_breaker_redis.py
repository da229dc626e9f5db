"""CircuitBreaker on a real Redis: separate clients share one breaker; a half-open breaker lets one probe through."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.conftest import ConnectRedis
from workers.llm.breaker import CircuitBreaker, breaker_key

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0


def _breaker(client: redis.Redis, name: str) -> CircuitBreaker:
    return CircuitBreaker(client, name=name, failure_threshold=3, open_seconds=5.0)


def test_breaker_is_seen_open_by_another_client_when_one_client_opens_it(
    connect_redis: ConnectRedis,
) -> None:
    # Given two breakers on the same key, each with its own connection
    name = breaker_key("http://127.0.0.1:9/v1", f"model-{uuid.uuid4().hex}")
    first, second = _breaker(connect_redis(), name), _breaker(connect_redis(), name)

    # When the first records enough failures
    for _ in range(3):
        first.record_failure(T0)

    # Then the second sees the breaker open and waits
    assert second.state(T0).status == "open"
    assert second.before_call(T0 + 1.0) == pytest.approx(4.0)


def test_before_call_grants_one_probe_when_twenty_threads_ask_a_half_open_breaker(
    connect_redis: ConnectRedis,
) -> None:
    # Given a breaker whose open period has passed, and twenty callers with connections of their own
    name = breaker_key("http://127.0.0.1:9/v1", f"model-{uuid.uuid4().hex}")
    callers = [_breaker(connect_redis(), name) for _ in range(20)]
    for _ in range(3):
        callers[0].record_failure(T0)
    assert callers[0].state(T0 + 5.0).status == "half_open"
    start = threading.Barrier(len(callers))

    def ask(caller: CircuitBreaker) -> float:
        start.wait(timeout=10)
        return caller.before_call(T0 + 5.0)

    # When they all ask at once
    with ThreadPoolExecutor(max_workers=len(callers)) as pool:
        waits = list(pool.map(ask, callers))

    # Then exactly one of them probes
    assert waits.count(0.0) == 1
    assert all(wait > 0.0 for wait in waits if wait != 0.0)
