"""The retry schedule of webhook deliveries: what each answer means, the jittered delays, the default."""

from __future__ import annotations

import itertools

import pytest

from shared.settings import Settings
from shared.webhooks.parsing import parse_retry_schedule
from workers.webhooks.schedule import JITTER, Decision, Verdict, decide, retry_delay

DELAYS = (5.0, 300.0, 1800.0)


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_any_2xx_is_delivered(status: int) -> None:
    assert decide(status, attempt=1, delays=DELAYS, rand=0.5) == Decision(Verdict.DELIVERED)


def test_410_disables_the_endpoint_at_any_attempt() -> None:
    assert decide(410, attempt=1, delays=DELAYS, rand=0.5).verdict is Verdict.DISABLE_ENDPOINT
    assert decide(410, attempt=4, delays=DELAYS, rand=0.5).verdict is Verdict.DISABLE_ENDPOINT


@pytest.mark.parametrize("status", [None, 301, 400, 404, 429, 500, 503])
def test_anything_else_is_retried_after_the_next_delay_until_the_schedule_is_spent(status: int | None) -> None:
    assert [decide(status, attempt=n, delays=DELAYS, rand=0.5) for n in (1, 2, 3, 4)] == [
        Decision(Verdict.RETRY, 5.0), Decision(Verdict.RETRY, 300.0), Decision(Verdict.RETRY, 1800.0),
        Decision(Verdict.GIVE_UP),
    ]  # fmt: skip


def test_the_jitter_stays_within_its_bounds_and_spreads_retries() -> None:
    low, middle, high = (retry_delay(2, delays=DELAYS, rand=rand) for rand in (0.0, 0.5, 0.999999))
    assert low == pytest.approx(300 * (1 - JITTER))
    assert middle == pytest.approx(300.0)
    assert high == pytest.approx(300 * (1 + JITTER), rel=1e-5)
    assert retry_delay(0, delays=DELAYS, rand=0.5) is None


def test_the_default_schedule_backs_off_exponentially_over_about_a_day() -> None:
    delays = parse_retry_schedule(Settings().webhook_retry_schedule)
    assert len(delays) == 7  # eight attempts
    assert all(later > earlier for earlier, later in itertools.pairwise(delays))
    assert 24 * 3600 <= sum(delays) <= 36 * 3600
    assert delays[0] <= 10


@pytest.mark.parametrize("raw", ["5,abc", "5,-1", "0", "nan", "inf"])
def test_a_schedule_that_is_not_positive_seconds_is_refused_at_start(raw: str) -> None:
    with pytest.raises(ValueError, match="APTIX_WEBHOOK_RETRY_SCHEDULE"):
        Settings(webhook_retry_schedule=raw)


def test_an_empty_schedule_means_a_single_attempt() -> None:
    assert parse_retry_schedule(" ") == ()
    assert decide(500, attempt=1, delays=(), rand=0.5) == Decision(Verdict.GIVE_UP)
