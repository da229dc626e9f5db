"""StateStore: the port every step uses for hot turn state (Redis in production, memory in tests)."""

from __future__ import annotations

from typing import Protocol

from shared.state.turn_state import TurnState

__all__ = ["StateStore"]


class StateStore(Protocol):
    """Cluster-safe turn state: versioned documents and short step leases."""

    def load(self, turn_id: str) -> TurnState | None:
        """The turn's state, or None when the store does not have it."""

    def save(self, state: TurnState, *, ttl_seconds: int) -> None:
        """Write ``state`` if nobody saved since it was loaded; bumps ``state.version``.

        Raises:
            StateConflict: when another writer saved first.
        """

    def claim(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        """Take the lease on one step; False when someone else holds it."""

    def extend(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        """Renew a lease we hold (the heartbeat); False when we lost it."""

    def release(self, turn_id: str, step_key: str, *, owner: str) -> None:
        """Give a lease back."""

    def mark_cancelled(self, turn_id: str, *, ttl_seconds: int) -> None:
        """Record that the turn was cancelled."""

    def is_cancelled(self, turn_id: str) -> bool:
        """Whether the turn was cancelled."""

    def ping(self) -> bool:
        """Whether the store answers."""
