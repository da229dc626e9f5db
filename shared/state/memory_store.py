"""MemoryStateStore: the StateStore in one process (unit tests, and the embedded dev mode)."""

from __future__ import annotations

import threading
import time

from shared.errors import StateConflict
from shared.state.turn_state import TurnState

__all__ = ["MemoryStateStore"]


class MemoryStateStore:
    """A thread-safe in-memory StateStore with the same semantics as the Redis one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}
        self._claims: dict[tuple[str, str], tuple[str, float]] = {}
        self._cancelled: set[str] = set()

    def load(self, turn_id: str) -> TurnState | None:
        with self._lock:
            raw = self._states.get(turn_id)
        return None if raw is None else TurnState.model_validate_json(raw)

    def save(self, state: TurnState, *, ttl_seconds: int) -> None:
        with self._lock:
            raw = self._states.get(state.turn_id)
            current = None if raw is None else TurnState.model_validate_json(raw).version
            if current is not None and current != state.version:
                raise StateConflict(f"turn {state.turn_id!r} moved from version {state.version} to {current}")
            state.version += 1
            self._states[state.turn_id] = state.model_dump_json()

    def claim(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        with self._lock:
            held = self._claims.get((turn_id, step_key))
            if held is not None and held[1] > time.monotonic():
                return False
            self._claims[(turn_id, step_key)] = (owner, time.monotonic() + ttl_seconds)
            return True

    def extend(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        with self._lock:
            held = self._claims.get((turn_id, step_key))
            if held is None or held[0] != owner:
                return False
            self._claims[(turn_id, step_key)] = (owner, time.monotonic() + ttl_seconds)
            return True

    def release(self, turn_id: str, step_key: str, *, owner: str) -> None:
        with self._lock:
            held = self._claims.get((turn_id, step_key))
            if held is not None and held[0] == owner:
                del self._claims[(turn_id, step_key)]

    def mark_cancelled(self, turn_id: str, *, ttl_seconds: int) -> None:
        with self._lock:
            self._cancelled.add(turn_id)

    def is_cancelled(self, turn_id: str) -> bool:
        with self._lock:
            return turn_id in self._cancelled

    def flush(self) -> None:
        """Forget everything, as a Redis restart without persistence would."""
        with self._lock:
            self._states.clear()
            self._claims.clear()
            self._cancelled.clear()

    def ping(self) -> bool:
        return True
