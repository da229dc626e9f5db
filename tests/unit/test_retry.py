"""The one retry policy: delays and budgets per reason."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.settings import Settings
from shared.state import ModelRetry
from tests.unit.fakes import FIXED_NOW
from workers import retry


def test_infrastructure_backoff_doubles_to_its_cap_and_never_gives_up() -> None:
    settings = Settings()
    delays = [retry.delay(retry.Reason.INFRASTRUCTURE, attempt=n, settings=settings, rand=0.999) for n in range(12)]
    assert delays[0] == pytest.approx(0.5, rel=0.01) and delays[3] == pytest.approx(4.0, rel=0.01)
    assert all(d is not None and d <= retry.MAX_DELAY_SECONDS for d in delays)


def test_step_busy_waits_half_the_lease() -> None:
    assert retry.delay(retry.Reason.STEP_BUSY, attempt=99, settings=Settings(step_lease_seconds=30), rand=0.1) == 15


def test_turn_not_recorded_is_tried_again_soon_then_every_half_second_for_twenty_seconds() -> None:
    settings = Settings()
    waits: list[float] = []
    while (
        wait := retry.delay(retry.Reason.TURN_NOT_RECORDED, attempt=len(waits), settings=settings, rand=0.0)
    ) is not None:
        waits.append(wait)
    assert waits[:7] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5]
    assert set(waits[6:]) == {0.5}
    assert 19.5 < sum(waits) <= 20.0


def test_model_delay_honours_the_hint_and_spends_the_time_budget() -> None:
    settings = Settings(llm_retry_budget_seconds=60)
    tries = ModelRetry(step_key="0:4:llm_call:1", since=FIXED_NOW, calls=1)
    assert retry.model_delay(tries, now=FIXED_NOW, hint=10.0, settings=settings, rand=0.0) == 10.0
    later = FIXED_NOW + timedelta(seconds=55)
    assert retry.model_delay(tries, now=later, hint=10.0, settings=settings, rand=0.0) is None


def test_model_delay_gives_up_when_the_calls_are_used_up() -> None:
    tries = ModelRetry(step_key="k", since=FIXED_NOW, calls=3)
    assert retry.model_delay(tries, now=FIXED_NOW, hint=None, settings=Settings(llm_max_attempts=3), rand=0.0) is None


def test_model_delay_backs_off_exponentially_without_a_hint() -> None:
    settings = Settings()
    waits = [
        retry.model_delay(ModelRetry(step_key="k", since=FIXED_NOW, calls=n), now=FIXED_NOW, hint=None,
                          settings=settings, rand=0.999)
        for n in (1, 2, 3, 8)
    ]  # fmt: skip
    assert waits == [pytest.approx(1.0, rel=0.01), pytest.approx(2.0, rel=0.01), pytest.approx(4.0, rel=0.01),
                     pytest.approx(retry.MAX_DELAY_SECONDS, rel=0.01)]  # fmt: skip
