"""wait_for: poll a condition instead of sleeping a fixed time and hoping it came true."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], *, what: str, seconds: float = 30.0, interval: float = 0.05) -> T:
    """Call ``condition`` until it returns a truthy value, and return that value.

    Args:
        condition: checks the thing waited for; a falsy result means "not yet".
        what: what is waited for, for the failure message.
        seconds: how long to wait before failing the test.
        interval: the pause between two checks.

    Returns:
        The first truthy value ``condition`` returned.

    Raises:
        AssertionError: when ``condition`` stayed falsy for ``seconds``.
    """
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:g}s for {what}; it did not happen (last check: {value!r})")
        time.sleep(interval)
