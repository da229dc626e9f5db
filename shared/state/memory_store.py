"""MemoryStateStore: every port of ``shared.state.store`` in one process (unit tests), with the same
semantics as Redis, except that it keeps no admission books (``leave_admission`` is a no-op) and keeps each
turn's merged tokens (``tokens``) without the organisations' totals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from datetime import date

from shared.errors import StateConflict
from shared.state.admission import Admitted
from shared.state.store import BrokerPush, EventSink, Lease, Release, StepStart, take_unsent_events
from shared.state.token_usage import TurnTokens
from shared.state.turn_state import TurnState

__all__ = ["MemoryStateStore"]


class MemoryStateStore:
    """A thread-safe in-memory state store; a save's events go to ``events`` (dropped when None)."""

    def __init__(self, events: EventSink | None = None) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}
        self._claims: dict[tuple[str, str], tuple[str, float]] = {}
        self.deliveries: dict[tuple[str, str], tuple[int, int, int]] = {}
        """Each step's delivery count, the number of the delivery last held back and how many deliveries
        ran alone, by (turn id, step key) (kept until deleted: no expiry here)."""
        self._cancelled: set[str] = set()
        self.markers: dict[str, float] = {}
        self.timers: dict[str, float] = {}
        self.tokens: dict[tuple[str, date, str], int] = {}
        """Each turn's tokens as merged by saves (the largest), by (organisation, day, turn id)."""

    def load(self, turn_id: str) -> TurnState | None:
        with self._lock:
            raw = self._states.get(turn_id)
        return None if raw is None else TurnState.model_validate_json(raw)

    def begin(
        self, lease: Lease, *, ttl_seconds: int, check_cancel: bool = True, alive_until: float | None = None
    ) -> StepStart:
        with self._lock:
            if check_cancel and lease.turn_id in self._cancelled:
                return StepStart(cancelled=True, claimed=False)
            if not self._claim(lease, ttl_seconds):
                return StepStart(cancelled=False, claimed=False)
            step = (lease.turn_id, lease.step_key)
            before, held, alone = self.deliveries.get(step, (0, 0, 0))
            self.deliveries[step] = (before + 1, held, alone)
            raw = self._states.get(lease.turn_id)
            if raw is None and alive_until is not None:
                self.markers[lease.turn_id] = alive_until
        state = None if raw is None else TurnState.model_validate_json(raw)
        return StepStart(
            cancelled=False, claimed=True, state=state, deliveries=before + 1, held_back_at=held, lost_alone=alone
        )

    def save(
        self,
        state: TurnState,
        *,
        ttl_seconds: int,
        alive_until: float | None = None,
        release: Lease | None = None,
        leave_admission: bool = False,
        push: BrokerPush | None = None,
        tokens: TurnTokens | None = None,
    ) -> None:
        if push is not None:
            raise ValueError("the memory state store has no broker to push a step message to")
        with self._lock:
            if tokens is not None and tokens.tokens > 0:
                counted = (tokens.org_id, tokens.day, tokens.turn_id)
                self.tokens[counted] = max(self.tokens.get(counted, 0), tokens.tokens)
            raw = self._states.get(state.turn_id)
            current = None if raw is None else TurnState.model_validate_json(raw).version
            if (current or 0) != state.version:
                raise StateConflict(f"turn {state.turn_id!r} moved from version {state.version} to {current}")
            state.version += 1
            events, _undo = take_unsent_events(state)
            self._states[state.turn_id] = state.model_dump_json()
            if self._events is not None and events:
                self._events.extend(state.turn_id, events, round_=state.round)
            if alive_until is None:
                self.markers.pop(state.turn_id, None)
            else:
                self.markers[state.turn_id] = alive_until
            if release is not None:
                self._release(release)
                self.deliveries.pop((release.turn_id, release.step_key), None)

    def drop(self, turn_id: str) -> None:
        with self._lock:
            self._states.pop(turn_id, None)

    def claim(self, lease: Lease, *, ttl_seconds: int) -> bool:
        with self._lock:
            return self._claim(lease, ttl_seconds)

    def renew(self, leases: Sequence[Lease], *, ttl_seconds: int, alive_until: float) -> list[Lease]:
        lost = []
        with self._lock:
            for lease in leases:
                held = self._claims.get((lease.turn_id, lease.step_key))
                if held is None or held[0] != lease.owner or held[1] <= time.monotonic():
                    lost.append(lease)
                    continue
                self._claims[(lease.turn_id, lease.step_key)] = (lease.owner, time.monotonic() + ttl_seconds)
                self.markers[lease.turn_id] = max(alive_until, self.markers.get(lease.turn_id, alive_until))
        return lost

    def release(self, lease: Lease, *, why: Release = Release.ENDED) -> None:
        step = (lease.turn_id, lease.step_key)
        with self._lock:
            if not self._release(lease):
                return
            if why is Release.ENDED:
                self.deliveries.pop(step, None)
            elif why is Release.HELD_BACK and step in self.deliveries:
                count, _held, alone = self.deliveries[step]
                self.deliveries[step] = (count - 1, count, alone)

    def record_alone(self, lease: Lease) -> bool:
        step = (lease.turn_id, lease.step_key)
        with self._lock:
            held = self._claims.get(step)
            if held is None or held[0] != lease.owner or held[1] <= time.monotonic():
                return False
            count, held_back, alone = self.deliveries.get(step, (0, 0, 0))
            self.deliveries[step] = (count, held_back, alone + 1)
            return True

    def lapse(self, lease: Lease) -> None:
        """Let ``lease`` lapse now, as a dead worker's lease does once its TTL has passed."""
        with self._lock:
            self._claims.pop((lease.turn_id, lease.step_key), None)

    def _claim(self, lease: Lease, ttl_seconds: int) -> bool:
        held = self._claims.get((lease.turn_id, lease.step_key))
        if held is not None and held[1] > time.monotonic():
            return False
        self._claims[(lease.turn_id, lease.step_key)] = (lease.owner, time.monotonic() + ttl_seconds)
        return True

    def _release(self, lease: Lease) -> bool:
        held = self._claims.get((lease.turn_id, lease.step_key))
        if held is None or held[0] != lease.owner:
            return False
        del self._claims[(lease.turn_id, lease.step_key)]
        return True

    def cancel_many(self, turn_ids: Sequence[str], *, ttl_seconds: int) -> None:
        with self._lock:
            for turn_id in turn_ids:
                self._cancelled.add(turn_id)
                self.markers.pop(turn_id, None)

    def is_cancelled(self, turn_id: str) -> bool:
        with self._lock:
            return turn_id in self._cancelled

    def mark_alive(
        self,
        turn_ids: Iterable[str],
        *,
        until: float,
        admitted: Admitted | None = None,
        pushes: Sequence[BrokerPush] = (),
    ) -> None:
        if pushes:
            raise ValueError("the memory state store has no broker to push a step message to")
        with self._lock:
            for turn_id in turn_ids:
                self.markers[turn_id] = until

    def alive_until(self, turn_ids: list[str]) -> dict[str, float]:
        with self._lock:
            return {turn_id: self.markers[turn_id] for turn_id in turn_ids if turn_id in self.markers}

    def forget(self, turn_id: str) -> None:
        with self._lock:
            self.markers.pop(turn_id, None)

    def forget_all(self) -> None:
        with self._lock:
            self.markers.clear()

    def prune_markers(self, *, before: float) -> int:
        with self._lock:
            stale = [turn_id for turn_id, until in self.markers.items() if until < before]
            for turn_id in stale:
                del self.markers[turn_id]
            return len(stale)

    def park(self, envelope_json: str, *, due: float) -> None:
        with self._lock:
            self.timers[envelope_json] = due

    def pop_due(self, *, now: float, limit: int = 500) -> list[str]:
        with self._lock:
            due = sorted((at, item) for item, at in self.timers.items() if at <= now)[:limit]
            for _at, item in due:
                del self.timers[item]
            return [item for _at, item in due]

    def flush(self) -> None:
        """Forget everything, as a Redis restart without persistence would."""
        with self._lock:
            self._states.clear()
            self._claims.clear()
            self.deliveries.clear()
            self._cancelled.clear()
            self.markers.clear()
            self.timers.clear()
