"""AdmissionWindow's control law and the workers' dispatch-delay reports, as plain functions (no Redis, no clock)."""

from __future__ import annotations

import pytest
import redis

from shared.state.admission import DelayReport
from workers.admission_window import CEILING, FLOOR, AdmissionWindow, combined_delay
from workers.dispatch_delays import LONGEST_COUNTED_SECONDS, DispatchDelays

TARGET = 0.005


def test_a_wait_above_the_target_cuts_the_window_by_a_fifth_once_per_drain() -> None:
    window = AdmissionWindow(target_seconds=TARGET, initial=50)
    assert window.update(0.008, in_flight=50, held=100) == 40
    # The turns in flight have not come down to the new size yet: no second cut
    assert window.update(0.008, in_flight=45, held=100) == 40
    # Once they have, it cuts again
    assert window.update(0.008, in_flight=40, held=100) == 32


def test_a_short_wait_grows_a_full_window_by_a_quarter_and_a_near_one_by_a_sixteenth() -> None:
    window = AdmissionWindow(target_seconds=TARGET, initial=64)
    assert window.update(0.001, in_flight=64, held=10) == 80
    assert window.update(0.004, in_flight=80, held=10) == 85
    assert window.update(None, in_flight=85, held=10) == 106  # nothing started lately: a slow model


def test_the_window_does_not_grow_when_nothing_waits_for_it_or_it_is_not_full() -> None:
    window = AdmissionWindow(target_seconds=TARGET, initial=64)
    assert window.update(0.001, in_flight=64, held=0) == 64
    assert window.update(0.001, in_flight=20, held=500) == 64


def test_the_window_stays_within_its_floor_and_ceiling() -> None:
    small = AdmissionWindow(target_seconds=TARGET, initial=FLOOR)
    assert small.update(1.0, in_flight=FLOOR, held=5) == FLOOR
    large = AdmissionWindow(target_seconds=TARGET, initial=CEILING)
    assert large.update(0.0, in_flight=CEILING, held=5) == CEILING


def test_the_workers_delays_combine_weighted_by_the_tasks_they_cover() -> None:
    assert combined_delay([]) is None
    busy, idle = DelayReport(least=0.010, samples=300, at=0.0), DelayReport(least=0.001, samples=100, at=0.0)
    assert combined_delay([busy, idle]) == pytest.approx(0.00775)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_process_reports_the_shortest_wait_of_each_interval_then_starts_afresh() -> None:
    clock, reports = _Clock(), list[DelayReport]()
    delays = DispatchDelays(reports.append, every=0.5, clock=clock)
    for sent, at in ((999.99, 1000.1), (1000.195, 1000.2), (1000.25, 1000.3)):
        clock.now = at
        delays.observe(sent)
    assert reports == []
    clock.now = 1000.5
    delays.observe(1000.45)  # the interval is over: this start reports
    assert reports == [DelayReport(least=pytest.approx(0.005), samples=4, at=1000.5)]
    clock.now = 1001.0
    delays.observe(1000.97)
    assert reports[-1] == DelayReport(least=pytest.approx(0.03), samples=1, at=1001.0)


def test_a_wait_below_zero_counts_as_none_one_too_long_as_the_longest_and_one_without_a_time_not_at_all() -> None:
    clock, reports = _Clock(), list[DelayReport]()
    delays = DispatchDelays(reports.append, every=0.0, clock=clock)
    delays.observe(None)
    assert reports == []
    delays.observe(clock.now + 0.002)  # the sender's clock a little ahead
    delays.observe(clock.now - 3600)  # redelivered after an hour
    assert [(r.least, r.samples) for r in reports] == [(0.0, 1), (LONGEST_COUNTED_SECONDS, 1)]


def test_a_report_redis_refuses_is_dropped_and_the_task_goes_on() -> None:
    def refuse(report: DelayReport) -> None:
        raise redis.ConnectionError("down")

    delays = DispatchDelays(refuse, every=0.0, clock=_Clock())
    delays.observe(999.0)  # no exception
