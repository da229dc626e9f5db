"""Tests of workers.llm.breaker.CircuitBreaker on fakeredis (real Lua), with an injected clock."""

from __future__ import annotations

import fakeredis
import pytest

from workers.llm.breaker import BreakerState, CircuitBreaker, breaker_key

T0 = 1_700_000_000.0
NAME = breaker_key("http://127.0.0.1:9/v1", "gpt-test")


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _breaker(client: fakeredis.FakeRedis, **options: float) -> CircuitBreaker:
    settings = {"failure_threshold": 3, "open_seconds": 5.0, "max_open_seconds": 60.0} | options
    return CircuitBreaker(
        client,
        name=NAME,
        failure_threshold=int(settings["failure_threshold"]),
        open_seconds=settings["open_seconds"],
        max_open_seconds=settings["max_open_seconds"],
    )


def _open(breaker: CircuitBreaker, now: float, *, failures: int = 3) -> None:
    for _ in range(failures):
        breaker.record_failure(now)


def test_before_call_returns_zero_when_breaker_is_closed(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    assert breaker.before_call(T0) == 0.0
    assert breaker.state(T0) == BreakerState(status="closed", failures=0, open_until=0.0, open_seconds=5.0)


def test_breaker_stays_closed_when_failures_are_below_threshold(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    _open(breaker, T0, failures=2)

    assert breaker.before_call(T0) == 0.0
    assert breaker.state(T0) == BreakerState(status="closed", failures=2, open_until=0.0, open_seconds=5.0)


def test_record_failure_opens_breaker_when_threshold_is_reached(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    _open(breaker, T0)

    assert breaker.state(T0) == BreakerState(status="open", failures=3, open_until=T0 + 5.0, open_seconds=5.0)


def test_before_call_returns_remaining_open_time_when_breaker_is_open(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)
    _open(breaker, T0)

    assert breaker.before_call(T0) == pytest.approx(5.0)
    assert breaker.before_call(T0 + 3.5) == pytest.approx(1.5)


def test_before_call_lets_exactly_one_probe_through_when_breaker_is_half_open(client: fakeredis.FakeRedis) -> None:
    # Given an open breaker seen by several callers (one instance each, as in separate processes)
    callers = [_breaker(client) for _ in range(5)]
    _open(callers[0], T0)
    assert callers[0].state(T0 + 5.0).status == "half_open"

    # When they all ask once the open period has passed
    waits = [caller.before_call(T0 + 5.0) for caller in callers]

    # Then the first becomes the probe and the others wait
    assert waits[0] == 0.0
    assert all(wait > 0.0 for wait in waits[1:])


def test_before_call_reports_probe_lease_capped_at_open_period_when_probe_is_in_flight(
    client: fakeredis.FakeRedis,
) -> None:
    # Given a half-open breaker whose probe (lease 30 s) went out at T0 + 5
    breaker = _breaker(client)
    _open(breaker, T0)
    assert breaker.before_call(T0 + 5.0) == 0.0

    # Then others wait the open period while most of the lease remains, and the rest of it near its end
    assert breaker.before_call(T0 + 6.0) == pytest.approx(5.0)
    assert breaker.before_call(T0 + 33.0) == pytest.approx(2.0)


def test_record_success_closes_breaker_when_probe_succeeds(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)
    _open(breaker, T0)
    assert breaker.before_call(T0 + 5.0) == 0.0

    breaker.record_success(T0 + 6.0)

    assert breaker.state(T0 + 6.0) == BreakerState(status="closed", failures=0, open_until=0.0, open_seconds=5.0)
    assert breaker.before_call(T0 + 6.0) == 0.0


def test_breaker_reopens_for_base_period_when_it_fails_again_after_a_probe_succeeded(
    client: fakeredis.FakeRedis,
) -> None:
    # Given a breaker whose period a failed probe doubled, then a probe that succeeded
    breaker = _breaker(client)
    _open(breaker, T0)
    assert breaker.before_call(T0 + 5.0) == 0.0
    breaker.record_failure(T0 + 5.0)
    assert breaker.before_call(T0 + 15.0) == 0.0
    breaker.record_success(T0 + 15.0)

    # When the threshold is reached again
    _open(breaker, T0 + 20.0)

    # Then it opens for the base period
    assert breaker.state(T0 + 20.0) == BreakerState(status="open", failures=3, open_until=T0 + 25.0, open_seconds=5.0)


def test_record_failure_doubles_open_period_when_probe_fails(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)
    _open(breaker, T0)
    assert breaker.before_call(T0 + 5.0) == 0.0

    breaker.record_failure(T0 + 6.0)

    assert breaker.state(T0 + 6.0) == BreakerState(status="open", failures=4, open_until=T0 + 16.0, open_seconds=10.0)
    assert breaker.before_call(T0 + 6.0) == pytest.approx(10.0)


def test_record_failure_caps_open_period_at_max_when_probes_keep_failing(client: fakeredis.FakeRedis) -> None:
    # Given a breaker that opened for 5 s
    breaker = _breaker(client, max_open_seconds=30.0)
    _open(breaker, T0)
    periods = []

    # When five probes in a row fail, each as soon as the breaker lets one through
    now = T0
    for _ in range(5):
        now = breaker.state(now).open_until
        assert breaker.before_call(now) == 0.0
        breaker.record_failure(now)
        periods.append(breaker.state(now).open_seconds)

    # Then the period doubles up to the max and stays there
    assert periods == [10.0, 20.0, 30.0, 30.0, 30.0]


def test_record_failure_leaves_open_period_alone_when_breaker_is_still_open(client: fakeredis.FakeRedis) -> None:
    # Given an open breaker
    breaker = _breaker(client)
    _open(breaker, T0)

    # When a call that started before it opened fails
    breaker.record_failure(T0 + 1.0)

    # Then it is counted, but the breaker still opens for 5 s from T0
    assert breaker.state(T0 + 1.0) == BreakerState(status="open", failures=4, open_until=T0 + 5.0, open_seconds=5.0)


def test_record_success_resets_failure_count_when_failures_are_not_consecutive(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    _open(breaker, T0, failures=2)
    breaker.record_success(T0 + 1.0)
    _open(breaker, T0 + 2.0, failures=2)

    assert breaker.state(T0 + 2.0) == BreakerState(status="closed", failures=2, open_until=0.0, open_seconds=5.0)
    assert breaker.before_call(T0 + 2.0) == 0.0


def test_before_call_grants_another_probe_when_probe_lease_lapses(client: fakeredis.FakeRedis) -> None:
    # Given a probe that went out at T0 + 5 and never reported (its lease is max(5 s, 30 s))
    prober, other = _breaker(client), _breaker(client)
    _open(prober, T0)
    assert prober.before_call(T0 + 5.0) == 0.0
    assert other.before_call(T0 + 34.9) > 0.0

    # When the lease has lapsed
    wait = other.before_call(T0 + 35.0)

    # Then another caller becomes the probe, and holds a lease of its own
    assert wait == 0.0
    assert prober.before_call(T0 + 35.0) > 0.0


def test_record_success_writes_nothing_when_there_were_no_failures(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    breaker.record_success(T0)
    assert breaker.before_call(T0) == 0.0

    assert client.dbsize() == 0


def test_record_failure_sets_day_long_ttl_when_it_writes(client: fakeredis.FakeRedis) -> None:
    breaker = _breaker(client)

    breaker.record_failure(T0)

    assert 23 * 3600 < client.ttl(NAME) <= 24 * 3600


def test_breaker_key_is_stable_when_base_url_and_model_match() -> None:
    key = breaker_key("https://api.example.com/v1", "gpt-4.1")

    assert key == breaker_key("https://api.example.com/v1/", "gpt-4.1")
    assert key.startswith("aptix:llm:{") and key.endswith("}:breaker") and len(key) == len("aptix:llm:{}:breaker") + 16
    assert key != breaker_key("https://api.example.com/v1", "gpt-4.1-mini")
    assert key != breaker_key("https://other.example.com/v1", "gpt-4.1")


@pytest.mark.parametrize(
    "options",
    [{"failure_threshold": 0}, {"open_seconds": 0.0}, {"open_seconds": 10.0, "max_open_seconds": 5.0}],
)
def test_breaker_refuses_settings_when_they_make_no_sense(
    client: fakeredis.FakeRedis, options: dict[str, float]
) -> None:
    with pytest.raises(ValueError):
        _breaker(client, **options)
