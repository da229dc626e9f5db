"""RateLimiter's Lua on a real Redis: request pacing, token reservations and their settlement, the
waiting line, pauses, and limiters on separate connections sharing one model's buckets.

Times are injected (``now``) unless a test is about the server's clock, so nothing here waits.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from tests.conftest import ConnectRedis
from workers.llm.breaker import CircuitBreaker, breaker_key
from workers.llm.limiter import BURST_SECONDS, MAX_PAUSE_SECONDS, Limits, RateLimiter, Slot, limiter_keys

pytestmark = pytest.mark.integration


T0 = 1_700_000_000.0


@pytest.fixture
def model() -> str:
    return f"model-{uuid.uuid4().hex}"


def _limiter(client: redis.Redis, model: str, **limits: int) -> RateLimiter:
    name, pause_name = limiter_keys("http://127.0.0.1:9/v1", model)
    return RateLimiter(client, name=name, pause_name=pause_name, limits=Limits(**limits))


def _most_in_one_second(times: list[float]) -> int:
    """The most calls any window [t, t + 1 s) holds."""
    ordered = sorted(times)
    return max(sum(1 for other in ordered if start <= other < start + 1.0) for start in ordered)


def test_calls_at_300_rpm_are_spread_so_no_second_sees_more_than_six(connect_redis: ConnectRedis, model: str) -> None:
    # Given four limiters (four workers) on one model at 300 requests a minute, and 60 calls that all
    # want to go at once, each coming back exactly when it is told to
    limiters = [_limiter(connect_redis(), model, rpm=300) for _ in range(4)]
    waiting = [(T0, index) for index in range(60)]
    heapq.heapify(waiting)
    granted: list[float] = []
    tries = 0

    # When they run until every call went
    while waiting:
        now, index = heapq.heappop(waiting)
        tries += 1
        slot = limiters[index % 4].acquire(0, now=now)
        if slot.wait == 0:
            granted.append(now)
        else:
            heapq.heappush(waiting, (now + slot.wait, index))

    # Then every call went, no one-second window saw more than 6, the pace was the limit's, and the
    # waiting line sent almost every held-back call back just once
    assert len(granted) == 60
    assert _most_in_one_second(granted) <= 6
    assert max(granted) - min(granted) == pytest.approx(59 * 0.2 - BURST_SECONDS, abs=0.06)
    assert tries <= 60 + 59 + 5


def test_held_back_calls_are_given_slots_one_interval_apart(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, rpm=60)
    assert limiter.acquire(0, now=T0) == Slot(tokens=0)
    waits = [limiter.acquire(0, now=T0).wait for _ in range(4)]
    assert waits == pytest.approx([1 - BURST_SECONDS, 2 - BURST_SECONDS, 3 - BURST_SECONDS, 4 - BURST_SECONDS])
    assert limiter.acquire(0, now=T0 + 1 - BURST_SECONDS).wait == 0  # the first slot's holder goes


def test_only_one_of_twenty_simultaneous_callers_goes_on_the_servers_clock(
    connect_redis: ConnectRedis, model: str
) -> None:
    # Given twenty callers with connections of their own on a model allowed one call a minute
    callers = [_limiter(connect_redis(), model, rpm=1) for _ in range(20)]
    start = threading.Barrier(len(callers))

    def ask(caller: RateLimiter) -> Slot:
        start.wait(timeout=10)
        return caller.acquire(0)  # the Redis server's clock

    # When they all ask at once
    with ThreadPoolExecutor(max_workers=len(callers)) as pool:
        answers = list(pool.map(ask, callers))

    # Then exactly one goes, and the others are told distinct slots a minute apart (each wait is its
    # slot less the server's time when that caller's script ran, a little later for each)
    assert sum(1 for answer in answers if answer.wait == 0) == 1
    waits = sorted(answer.wait for answer in answers if answer.wait > 0)
    assert all(59.0 < later - earlier <= 60.0 + 1e-6 for earlier, later in itertools.pairwise(waits)), waits
    assert {answer.reason for answer in answers if answer.wait > 0} == {"requests"}


def test_a_call_waits_until_the_tokens_reserved_before_it_are_paid_for(connect_redis: ConnectRedis, model: str) -> None:
    # 6,000 tokens a minute: 100 a second
    first, second = (_limiter(connect_redis(), model, tpm=6000) for _ in range(2))
    assert first.acquire(500, now=T0) == Slot(tokens=500)
    held = second.acquire(500, now=T0 + 1)
    assert held.reason == "tokens" and held.wait == pytest.approx(4 - BURST_SECONDS)
    assert second.acquire(500, now=T0 + 5) == Slot(tokens=500)


def test_a_call_larger_than_a_minute_of_tokens_goes_once_the_bucket_is_paid_off(
    connect_redis: ConnectRedis, model: str
) -> None:
    limiter = _limiter(connect_redis(), model, tpm=600)  # 10 tokens a second
    assert limiter.acquire(5000, now=T0).wait == 0  # nothing before it: it goes, and the bucket owes 500 s
    assert limiter.acquire(1, now=T0 + 400).wait == pytest.approx(100 - BURST_SECONDS)


def test_settling_gives_back_the_tokens_a_call_reserved_but_did_not_use(
    connect_redis: ConnectRedis, model: str
) -> None:
    limiter = _limiter(connect_redis(), model, tpm=6000)
    reserved = limiter.acquire(1000, now=T0)  # 10 s of the bucket
    limiter.settle(reserved, used=200, now=T0 + 1)  # 2 s of it used
    assert limiter.acquire(100, now=T0 + 2).wait == 0


def test_settling_takes_the_tokens_a_call_used_beyond_its_estimate(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, tpm=6000)
    reserved = limiter.acquire(100, now=T0)  # 1 s of the bucket
    limiter.settle(reserved, used=1100, now=T0 + 1)  # 11 s of it used
    held = limiter.acquire(100, now=T0 + 2)
    assert held.reason == "tokens" and held.wait == pytest.approx(9 - BURST_SECONDS)


def test_settling_a_call_that_was_not_made_gives_its_request_back_too(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, rpm=60, tpm=6000)
    reserved = limiter.acquire(100, now=T0)
    assert limiter.acquire(100, now=T0).wait > 0
    limiter.settle(reserved, used=0, called=False, now=T0)
    assert limiter.acquire(100, now=T0 + 0.01).wait == 0


def test_either_limit_holds_a_call_back_and_is_named(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, rpm=60, tpm=60_000)  # 1 s per request, 1,000 tokens a second
    limiter.acquire(10, now=T0)
    assert limiter.acquire(10, now=T0 + 0.5).reason == "requests"
    limiter.acquire(5000, now=T0 + 1)  # 5 s of tokens
    held = limiter.acquire(10, now=T0 + 2)
    assert held.reason == "tokens" and held.wait == pytest.approx(4 - BURST_SECONDS, abs=0.01)


def test_a_pause_stops_every_limiter_of_the_model_until_it_ends(connect_redis: ConnectRedis, model: str) -> None:
    # Given a model without rate limits, and two limiters on it (two workers)
    first, second = (_limiter(connect_redis(), model) for _ in range(2))
    assert second.acquire(0, now=T0) == Slot()

    # When a 429 with Retry-After: 2 pauses it through the first
    assert first.pause(2.0, now=T0) == T0 + 2.0

    # Then the second holds its calls back until the pause ends
    held = second.acquire(0, now=T0 + 0.5)
    assert held.reason == "paused" and held.wait == pytest.approx(1.5)
    assert second.acquire(0, now=T0 + 2.0) == Slot()


def test_a_pause_never_shortens_a_longer_one_and_is_capped(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, rpm=600)
    assert limiter.pause(10.0, now=T0) == T0 + 10.0
    assert limiter.pause(1.0, now=T0 + 1) == T0 + 10.0
    assert limiter.pause(86_400.0, now=T0 + 2) == T0 + 2 + MAX_PAUSE_SECONDS


def test_another_model_or_api_root_has_buckets_of_its_own(connect_redis: ConnectRedis, model: str) -> None:
    limiter = _limiter(connect_redis(), model, rpm=1)
    other = _limiter(connect_redis(), model + "-other", rpm=1)
    limiter.acquire(0, now=T0)
    limiter.pause(30.0, now=T0)
    assert other.acquire(0, now=T0) == Slot()
    assert limiter_keys("http://a/v1", model) != limiter_keys("http://b/v1", model)
    assert limiter_keys("http://a/v1/", model) == limiter_keys("http://a/v1", model)


def test_a_model_without_limits_writes_nothing(connect_redis: ConnectRedis, model: str) -> None:
    client = connect_redis()
    limiter = _limiter(client, model)
    slot = limiter.acquire(1000)
    limiter.settle(slot, used=5)
    assert slot == Slot() and client.keys("aptix:llm:*") == []


def test_the_buckets_expire_once_idle(connect_redis: ConnectRedis, model: str) -> None:
    client = connect_redis()
    limiter = _limiter(client, model, rpm=60)
    limiter.acquire(0)
    name, _ = limiter_keys("http://127.0.0.1:9/v1", model)
    assert 3600 <= client.ttl(name) <= 3602


# --- the limits and the model's circuit breaker in one round trip ---------------------------------------------------

REQUEST = {"model": "m", "input": "hello", "max_output_tokens": 100}


def _breaker(client: redis.Redis, model: str) -> CircuitBreaker:
    return CircuitBreaker(client, name=breaker_key("http://127.0.0.1:9/v1", model), failure_threshold=1)


def _commands(client: redis.Redis, sent: list[str]) -> list[str]:
    """``sent``, to which the commands ``client`` sends from now on are added, by name."""
    send = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return send(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    return sent


@pytest.mark.parametrize("together", [True, False], ids=["same-connection", "breaker-elsewhere"])
def test_the_breaker_is_asked_once_the_limits_let_a_call_go_and_an_open_one_leaves_nothing_charged(
    connect_redis: ConnectRedis, model: str, together: bool
) -> None:
    client = connect_redis()
    limiter = _limiter(client, model, rpm=60, tpm=60_000)  # 1 s a request
    breaker = _breaker(client if together else connect_redis(), model)
    warm = _limiter(client, model + "-warm")  # the server has the scripts already (no NOSCRIPT, SCRIPT LOAD)
    warm.pace(REQUEST, _breaker(breaker.client, model + "-warm"))
    sent = _commands(client, [])
    if not together:
        _commands(breaker.client, sent)

    # a closed breaker: the call goes, charged, in one round trip when the breaker is on the limiter's connection
    slot = limiter.pace(REQUEST, breaker, at=T0, now=T0)
    assert slot.wait == 0 and slot.breaker_wait == 0 and slot.tokens > 0
    assert len(sent) == (1 if together else 2), sent
    assert limiter.acquire(0, now=T0 + 0.5).reason == "requests"  # charged: the next second is taken

    # an open breaker: the limits would let the call go (a second later), the breaker says wait, nothing is charged
    breaker.record_failure(T0)
    stopped = limiter.pace(REQUEST, breaker, at=T0 + 1, now=T0 + 1)
    assert stopped.breaker_wait == pytest.approx(4.0) and stopped.wait == 0 and stopped.tokens == 0
    assert limiter.acquire(0, now=T0 + 1) == Slot()  # the slot of T0 + 1 was still free


@pytest.mark.parametrize("limited", [False, True])
def test_the_leave_says_whether_the_breaker_had_anything_to_remember(
    connect_redis: ConnectRedis, model: str, limited: bool
) -> None:
    client = connect_redis()
    limiter = _limiter(client, model, rpm=600) if limited else _limiter(client, model)
    breaker = CircuitBreaker(client, name=breaker_key("http://127.0.0.1:9/v1", model), failure_threshold=2)
    assert limiter.pace(REQUEST, breaker, at=T0, now=T0).breaker_clean  # no hash: a success need not DEL
    assert breaker.before_call(T0) == 0.0
    breaker.record_failure(T0)  # one failure, below the threshold: closed, but remembered
    remembers = limiter.pace(REQUEST, breaker, at=T0 + 1, now=T0 + 1)
    assert remembers.wait == 0 and remembers.breaker_wait == 0 and not remembers.breaker_clean
    breaker.record_success(T0 + 1)
    assert limiter.pace(REQUEST, breaker, at=T0 + 2, now=T0 + 2).breaker_clean
    breaker.record_failure(T0 + 2)
    breaker.record_failure(T0 + 2)  # open for 5 s, then half-open: the probe's leave is not clean
    assert limiter.pace(REQUEST, breaker, at=T0 + 3, now=T0 + 3).breaker_wait > 0
    probe = limiter.pace(REQUEST, breaker, at=T0 + 8, now=T0 + 8)
    assert probe.breaker_wait == 0 and not probe.breaker_clean


def test_a_call_the_limits_hold_back_does_not_take_a_half_open_breakers_probe(
    connect_redis: ConnectRedis, model: str
) -> None:
    client = connect_redis()
    limiter = _limiter(client, model, rpm=60)
    breaker = _breaker(client, model)
    breaker.record_failure(T0)  # open for 5 s
    limiter.acquire(0, now=T0 + 10)
    # half-open at T0 + 10.5, but the limits hold the call back until T0 + 11: the probe is left to a call that goes
    held = limiter.pace(REQUEST, breaker, at=T0 + 10.5, now=T0 + 10.5)
    assert held.reason == "requests" and held.breaker_wait == 0
    assert client.hget(breaker.name, "probe_until") is None
    probe = limiter.pace(REQUEST, breaker, at=T0 + 11, now=T0 + 11)
    assert probe == Slot() and client.hget(breaker.name, "probe_until") is not None
    assert limiter.pace(REQUEST, breaker, at=T0 + 12, now=T0 + 12).breaker_wait > 0  # one probe at a time
