"""Cached: a value read from the database and kept a few seconds, so that every gateway and worker sees
a change made elsewhere (``aptix orgs set``, ``aptix webhooks secret add``) within seconds, without a
restart, at the cost of one read per process every few seconds instead of one per request.

A read that fails keeps the last value it had (logged), so a database outage does not drop limits or
webhook secrets already known; the first read of a process has nothing to keep, and raises. While one
thread reads a stale value again, the others take the stale one rather than wait (a thread holding a
database connection must not wait for the reader's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["REFRESH_SECONDS", "Cached"]

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 2.0
"""How old a cached value may be before it is read again: a change shows everywhere within this (and the
time one read takes), well inside the 5 s docs/tenancy.md promises."""

_T = TypeVar("_T")


class Cached(Generic[_T]):
    """A value from ``load``, read again once it is ``seconds`` old; one reader at a time reads it."""

    def __init__(
        self,
        load: Callable[[], _T],
        *,
        seconds: float = REFRESH_SECONDS,
        what: str = "a cached value",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._seconds = seconds
        self._what = what
        self._clock = clock
        self._lock = threading.Lock()
        self._value: _T | None = None
        self._loaded = False
        self._read_at = float("-inf")

    @property
    def fresh(self) -> bool:
        """Whether :meth:`get` would answer without reading."""
        return self._loaded and self._clock() - self._read_at < self._seconds

    def get(self) -> _T:
        """The value, read again first when it is older than ``seconds``.

        Raises:
            Exception: whatever ``load`` raises, when no value was ever read.
        """
        if self.fresh:
            return self._value  # type: ignore[return-value]  # loaded: a _T
        if not self._lock.acquire(blocking=not self._loaded):
            return self._value  # type: ignore[return-value]  # another thread reads it; the last one meanwhile
        try:
            if not self.fresh:
                try:
                    self._value = self._load()
                    self._loaded = True
                except Exception as exc:
                    if not self._loaded:
                        raise
                    logger.warning("could not read %s again (%s: %s); keeping the last one",
                                   self._what, type(exc).__name__, exc)  # fmt: skip
                self._read_at = self._clock()
        finally:
            self._lock.release()
        return self._value  # type: ignore[return-value]  # loaded: a _T

    def forget(self) -> None:
        """Read again at the next :meth:`get` (tests; a process that knows the value changed)."""
        self._read_at = float("-inf")
