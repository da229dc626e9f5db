"""Cached: read once per period, read again after it, keep the last value when a read fails."""

from __future__ import annotations

import pytest

from shared.ttl_cache import Cached


class _Source:
    def __init__(self) -> None:
        self.value = 1
        self.reads = 0
        self.down = False

    def read(self) -> int:
        self.reads += 1
        if self.down:
            raise ConnectionError("database down")
        return self.value


def test_a_value_is_read_once_per_period_and_a_change_shows_after_it() -> None:
    source, now = _Source(), [0.0]
    cached = Cached(source.read, seconds=2.0, clock=lambda: now[0])
    assert (cached.get(), cached.get()) == (1, 1)
    source.value = 2
    now[0] = 1.9
    assert cached.get() == 1
    now[0] = 2.0
    assert cached.get() == 2
    assert source.reads == 2


def test_a_failed_read_keeps_the_last_value_and_the_first_one_raises() -> None:
    source, now = _Source(), [0.0]
    cached = Cached(source.read, seconds=2.0, clock=lambda: now[0])
    assert cached.get() == 1
    source.down, now[0] = True, 5.0
    assert cached.get() == 1  # the last one known
    now[0] = 6.0
    assert cached.get() == 1 and source.reads == 2  # not read again before the period
    fresh = Cached(source.read, seconds=2.0, clock=lambda: now[0])
    with pytest.raises(ConnectionError):
        fresh.get()
