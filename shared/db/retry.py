"""Writes that must land although a database connection dropped under them.

Used where the work before the write cannot be cheaply redone (a model's answer, a tool's outcome):
the write is tried again on a fresh connection (a dropped connection makes the pool discard it and every
older one), twice, before the error
goes to the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import InterfaceError, OperationalError

__all__ = ["retry_dropped_connection"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_PAUSES = (0.2, 0.5)


def retry_dropped_connection(action: Callable[[], T]) -> T:
    """Run ``action``; on a dropped connection, pause briefly and run it again (three tries in all).

    ``action`` must be safe to run twice (its first try may have committed before the answer was lost).
    """
    for pause in _PAUSES:
        try:
            return action()
        except (OperationalError, InterfaceError) as exc:
            logger.warning("a database write failed (%s); trying again", type(exc).__name__)
            time.sleep(pause)
    return action()
