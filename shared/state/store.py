"""The state store's ports, one job each: the turns' state documents, step leases, cancel flags,
in-flight markers and parked messages (Redis in production, memory in unit tests).

Both stores (``RedisStateStore``, ``MemoryStateStore``) implement every port below on one set of
keys: a step's begin and its save each touch several of them in one atomic round trip. A user
holds only the ports it needs (``workers.context.StepContext`` holds each as a field of its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from shared.state.admission import Admitted
from shared.state.token_usage import TurnTokens
from shared.state.turn_state import TurnState

__all__ = [
    "DELIVERIES_SECONDS",
    "BrokerPush",
    "CancelFlags",
    "EventSink",
    "InFlightMarkers",
    "Lease",
    "Release",
    "StepLeases",
    "StepStart",
    "Timers",
    "TurnStates",
    "event_json",
    "take_unsent_events",
]


DELIVERIES_SECONDS = 86400
"""How long a step's delivery count is kept after its last delivery (longer than any step waits for
its next delivery: the broker's visibility timeout, the reconciler's deadline times its re-drives)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease one worker (``owner``) holds while it runs one step of one turn."""

    turn_id: str
    step_key: str
    owner: str


@dataclass(frozen=True, slots=True)
class BrokerPush:
    """A step message a save puts on its broker queue in the same round trip (``shared.step_sender``), and
    the message it acknowledges there; or, for the save that ends a turn's chain, the acknowledgement alone.

    It is the one command kombu's Redis transport would send for the message (an ``LPUSH`` of the
    message to its queue's list for its priority), for a broker on the state store's Redis server.
    """

    key: str | None
    """The broker list the message goes to; None: no message, the acknowledgement alone."""
    payload: str
    """The message, as kombu puts it on the list ('' with no message)."""
    db: int | None = None
    """The broker's database on the server, when it is not the state store's; None: the same."""
    ack: str | None = None
    """The delivery tag of the message whose step this save ends, acknowledged in the same script (kombu's
    unacked entries deleted: ``unacked_index`` and ``unacked``), so the broker never gives it back once its
    step's save landed; None: the task acknowledges it as usual."""
    unacked_key: str = "unacked"
    unacked_index_key: str = "unacked_index"


@dataclass(frozen=True, slots=True)
class StepStart:
    """What :meth:`TurnStates.begin` found: the turn was cancelled, or the lease was (not) taken."""

    cancelled: bool
    claimed: bool
    state: TurnState | None = None
    deliveries: int = 0
    """With the lease taken: this delivery's number among the deliveries of the step since it last ended
    in a worker that lived (1 for the first; more when a worker died running it: ``APTIX_STEP_MAX_DELIVERIES``)."""
    held_back_at: int = 0
    """The delivery number at which a delivery of the step was last held back (:attr:`Release.HELD_BACK`); 0: never."""
    lost_alone: int = 0
    """How many of those lost deliveries ran alone in their worker process (:meth:`StepLeases.record_alone`):
    the deaths this step caused, which ``APTIX_STEP_MAX_DELIVERIES`` limits."""


class Release(StrEnum):
    """How a step's delivery ended without a save, which decides what becomes of its delivery count."""

    ENDED = "ended"
    """The step ended in a worker that lived (an outage, a step that already ran): its count goes."""
    GIVEN_UP = "given_up"
    """The step was given up on: its count stays past the limit, so every other copy is given up too."""
    HELD_BACK = "held_back"
    """The step, whose earlier delivery was lost, was sent again a little later instead of running now
    (apart from the steps that died with it): this delivery is not counted, and the store remembers
    its number (:attr:`StepStart.held_back_at`), so the next one runs."""


class TurnStates(Protocol):
    """The turns' state documents, versioned; a step begins on one and saves it (one round trip each)."""

    def load(self, turn_id: str) -> TurnState | None:
        """The turn's state, or None when the store does not have it."""

    def begin(
        self, lease: Lease, *, ttl_seconds: int, check_cancel: bool = True, alive_until: float | None = None
    ) -> StepStart:
        """Start a step, atomically: unless the turn was cancelled (its cancel flag, when ``check_cancel``),
        take ``lease`` for ``ttl_seconds`` and, when taken, return the turn's state (None if the store
        does not have it).

        When the store has no state for the turn (its first step, or a step carrying on from the
        database) and ``alive_until`` is given, the turn's in-flight marker is set to it, replacing
        whatever it was: the long marker the gateway gives a queued turn covers its wait in the
        broker, not its run, and must not vouch for a turn whose worker died mid-step.

        A taken lease also counts the delivery (:attr:`StepStart.deliveries`), in the same round trip:
        the step's counter (``deliveries_key``, kept :data:`DELIVERIES_SECONDS`) goes up by one, and
        only the step's save or the release of its lease deletes it. So it counts the deliveries
        whose worker died before the step ended, whoever sent them (the broker after its visibility
        timeout, a prefork pool's requeue, the reconciler), plus this one; a retry (a RetryAfter,
        an outage) ends with a save or a release first, and starts again at 1. The same counter
        says how many of the lost deliveries ran alone (:attr:`StepStart.lost_alone`).
        """

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
        """Write ``state`` if nobody saved since it was loaded; bumps ``state.version``.

        Everything else the write does, it is told to do, and does in the same atomic round trip:

        - the state's unsent events (:meth:`TurnState.unsent_events`) go to the turn's event log and
          the state records them as sent: a step that runs again because its save failed makes its
          trace records again, and they are sent once, with the save that keeps them;
        - the turn's in-flight marker moves to ``alive_until``, or goes (None: the turn's chain ended);
        - ``release`` is given back, and its step's delivery count deleted (the step ended in a live worker);
        - with ``leave_admission``, the turn leaves its organisation's turns in flight and the
          admission scheduler is woken (the books are ``shared.state.admission``'s: the save does
          for a turn whose chain ended what ``AdmissionQueue.finished`` does, without its round trip;
          the memory store keeps no admission books);
        - ``push``, the turn's next step message, goes on its broker queue (a push of no message: nothing
          goes), and the message it names (``BrokerPush.ack``) is acknowledged there: both if and only if
          the state was written (the memory store has no broker: it refuses a push);
        - ``tokens``, what the turn's commit wrote of its tokens, is merged into its organisation's count of
          the day (``shared.state.token_usage``), whatever the save's verdict: a refused save's copy of the
          step committed the same (the memory store keeps each turn's count, without the organisations' totals).

        Raises:
            StateConflict: when another writer saved first (nothing was written).
        """

    def drop(self, turn_id: str) -> None:
        """Forget the turn's state (the reconciler does, when a database checkpoint is newer)."""


class StepLeases(Protocol):
    """The leases of the steps running now: one live worker per step (``workers.leases``)."""

    def claim(self, lease: Lease, *, ttl_seconds: int) -> bool:
        """Take ``lease``; False when someone else holds it."""

    def renew(self, leases: Sequence[Lease], *, ttl_seconds: int, alive_until: float) -> list[Lease]:
        """Renew the leases we hold (one write for all) and push their turns' in-flight markers to
        ``alive_until`` (never back); returns the leases that were no longer ours."""

    def release(self, lease: Lease, *, why: Release = Release.ENDED) -> None:
        """Give a lease back (only its holder can), and end or keep the step's delivery count as ``why`` says."""

    def record_alone(self, lease: Lease) -> bool:
        """Record that the delivery holding ``lease`` runs alone in its worker process (only its holder can):
        if it is lost, the next delivery's :attr:`StepStart.lost_alone` counts it. False: the lease was not ours."""


class CancelFlags(Protocol):
    """The turns' cancel flags: a cancelled turn's next step stops at its begin."""

    def cancel_many(self, turn_ids: Sequence[str], *, ttl_seconds: int) -> None:
        """Record that each of ``turn_ids`` was cancelled and remove their in-flight markers (a cancelled
        turn is out of flight; a batch's cancel: few round trips however many turns)."""

    def is_cancelled(self, turn_id: str) -> bool:
        """Whether the turn was cancelled."""


class InFlightMarkers(Protocol):
    """Until when each unfinished turn counts as moving: what the reconciler reads (``INFLIGHT_KEY``)."""

    def mark_alive(
        self,
        turn_ids: Iterable[str],
        *,
        until: float,
        admitted: Admitted | None = None,
        pushes: Sequence[BrokerPush] = (),
    ) -> None:
        """Set the in-flight markers of ``turn_ids`` (a message for each was just sent, or goes now).

        In the same round trip (for up to a thousand turns), ``admitted`` counts them in their organisation's
        turns in flight (what ``AdmissionQueue.admit_now`` does; the memory store keeps no admission books) and
        ``pushes``, their messages, go on their broker queues (``StepSender.push``: a broker on the state
        store's Redis server; the memory store has no broker: it refuses a push).
        """

    def alive_until(self, turn_ids: list[str]) -> dict[str, float]:
        """The in-flight markers of those turns that have one."""

    def forget(self, turn_id: str) -> None:
        """Remove the turn's in-flight marker (it ended outside the pipeline)."""

    def forget_all(self) -> None:
        """Remove every in-flight marker (the broker lost its messages)."""

    def prune_markers(self, *, before: float) -> int:
        """Remove markers that lapsed before ``before``; returns how many."""


class Timers(Protocol):
    """Messages parked until they are due (long waits the broker must not hold: ``shared.step_sender``)."""

    def park(self, envelope_json: str, *, due: float) -> None:
        """Keep an envelope to send at ``due`` (Unix time)."""

    def pop_due(self, *, now: float, limit: int = 500) -> list[str]:
        """Take the parked envelopes that are due (each is returned to one caller only)."""


class EventSink(Protocol):
    """Where an in-memory store puts the events a save sends (``MemoryTurnEventLog``)."""

    def extend(self, turn_id: str, events: Sequence[tuple[str, str]], *, round_: int) -> None:
        """Append (name, JSON data) events of the turn's round ``round_``."""


def event_json(data: Any) -> str:
    """An event's data as its log stores it: compact JSON."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def take_unsent_events(state: TurnState) -> tuple[list[tuple[str, str]], Callable[[], None]]:
    """The state's unsent events as (name, JSON data), the state marked as having sent them, and the
    undo of that mark for a save that was refused."""
    events = [(name, event_json(data)) for name, data in state.unsent_events()]
    through, outbox = state.events_through, state.outbox
    state.events_through = state.trace[-1].seq if state.trace else 0
    state.outbox = []

    def undo() -> None:
        state.events_through, state.outbox = through, outbox

    return events, undo
