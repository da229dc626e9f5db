"""CircuitBreaker on a real Redis: separate clients share one breaker; a half-open breaker lets one probe through."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.conftest import claim_redis_databases
from tests.services_check import redis_url
from workers.llm.breaker import CircuitBreaker, breaker_key

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0


@pytest.fixture
def redis_db_url(services: None) -> Iterator[str]:
    """One Redis database claimed for this test, flushed after it."""
    (index,) = claim_redis_databases(1, uuid.uuid4().hex)
    url = f"{redis_url().rstrip('/')}/{index}"
    yield url
    with redis.Redis.from_url(url) as client:
        client.flushdb()


@pytest.fixture
def clients() -> Iterator[list[redis.Redis]]:
    """A list to which tests append the clients they open; each gets closed after the test."""
    opened: list[redis.Redis] = []
    yield opened
    for client in opened:
        client.close()


def _breaker(clients: list[redis.Redis], url: str, name: str) -> CircuitBreaker:
    client = redis.Redis.from_url(url)
    clients.append(client)
    return CircuitBreaker(client, name=name, failure_threshold=3, open_seconds=5.0)


def test_breaker_is_seen_open_by_another_client_when_one_client_opens_it(
    redis_db_url: str, clients: list[redis.Redis]
) -> None:
    # Given two breakers on the same key, each with its own connection
    name = breaker_key("http://127.0.0.1:9/v1", f"model-{uuid.uuid4().hex}")
    first, second = _breaker(clients, redis_db_url, name), _breaker(clients, redis_db_url, name)

    # When the first records enough failures
    for _ in range(3):
        first.record_failure(T0)

    # Then the second sees the breaker open and waits
    assert second.state(T0).status == "open"
    assert second.before_call(T0 + 1.0) == pytest.approx(4.0)


def test_before_call_grants_one_probe_when_twenty_threads_ask_a_half_open_breaker(
    redis_db_url: str, clients: list[redis.Redis]
) -> None:
    # Given a breaker whose open period has passed, and twenty callers with connections of their own
    name = breaker_key("http://127.0.0.1:9/v1", f"model-{uuid.uuid4().hex}")
    callers = [_breaker(clients, redis_db_url, name) for _ in range(20)]
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
