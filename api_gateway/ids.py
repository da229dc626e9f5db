"""Id assignment and recognition: ``sess_…`` and ``turn_…``."""

from __future__ import annotations

import re
import uuid

__all__ = ["is_batch_id", "is_session_id", "is_turn_id", "new_batch_id", "new_session_id", "new_turn_id"]

_SESSION = re.compile(r"^sess_[0-9a-f]{32}$")
_TURN = re.compile(r"^turn_[0-9a-f]{32}$")
_BATCH = re.compile(r"^batch_[0-9a-f]{32}$")


def new_session_id() -> str:
    """A fresh session id."""
    return f"sess_{uuid.uuid4().hex}"


def new_turn_id() -> str:
    """A fresh turn id."""
    return f"turn_{uuid.uuid4().hex}"


def is_session_id(value: str) -> bool:
    """Whether ``value`` has the shape of a session id."""
    return bool(_SESSION.match(value))


def is_turn_id(value: str) -> bool:
    """Whether ``value`` has the shape of a turn id."""
    return bool(_TURN.match(value))


def new_batch_id() -> str:
    """A fresh batch id."""
    return f"batch_{uuid.uuid4().hex}"


def is_batch_id(value: str) -> bool:
    """Whether ``value`` has the shape of a batch id."""
    return bool(_BATCH.match(value))
