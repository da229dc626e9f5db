"""The reconciler: no accepted turn is left stranded.

Every queued or running turn has a deadline in the database (``turns.deadline_at``) and, while it
moves, an in-flight marker in Redis that every state save and lease renewal pushes forward. The
active reconciler looks at turns past their database deadline: one whose marker is still ahead is
moving (its deadline is moved up to the marker); one without a live marker has stalled (a message
lost when a worker died, Redis restarted empty, a connection error), and is re-driven from the
newest state it can trust: the recorded next step in Redis when it has one, else the durable
checkpoint in the database, else the turn's first step. Re-sending is safe: every step is
idempotent. A turn re-driven ``APTIX_RECONCILER_MAX_REDRIVES`` times that still does not move fails
``internal_error``, so every accepted turn ends.

A copy runs inside every ``aptix worker`` (``--no-reconciler`` turns it off) and as ``aptix
reconciler``; one copy at a time is active, chosen through a Redis lease, and several copies or a
copy killed at any point do no harm (a scan only sends messages that are safe to send twice). Every
copy also sends the parked messages that are due (``shared.step_sender``). When the broker is a Redis
that lost its data (its sentinel key vanished), every marker is dropped, so each turn in flight is
re-driven at its deadline. The active copy also sends the webhook deliveries that are due and that no
message carries (``workers.webhooks.sweep``).

A queued turn's marker vouches for its first message for ``APTIX_RECONCILER_QUEUED_SECONDS``, the
time it may wait behind a backlog, until a worker begins that message: the begin replaces it with a
running turn's marker, so a worker that dies in the turn's first step strands it for one deadline,
not for the queued window. But a worker killed while it takes a message from a Redis queue
can lose it (the transport pops the message and records it as unacknowledged in two steps), and so
can a Redis failover (a push not yet replicated): so when the first step's queue is empty, a turn
still queued past its deadline is not waiting in it, and is re-driven whatever its marker says. For
that, a queued turn's deadline moves up one deadline at a time while its marker vouches for it, never
to the marker's end: it is judged again each deadline until its first message is begun.

A batch turn not yet started may be held for admission (``shared.state.admission``): such a turn is
waiting, not stalled, and its deadline moves up; one that is neither held nor released (Redis
restarted empty) is held again, at the back of its organisation's queue, rather than sent past the
organisation's limit. A released one is judged like any other turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

import redis
from sqlalchemy.exc import SQLAlchemyError

from shared.db.turns import InFlightTurn, TurnRepository
from shared.models.envelope import TurnEnvelope, first_step
from shared.models.turn import TurnStatus
from shared.result import ErrorInfo
from shared.settings import Settings
from shared.state import InFlightMarkers, TurnState, TurnStates
from shared.state.admission import Place
from shared.state.leader import Leader
from shared.step_sender import SEND_ERRORS, StepSender
from shared.telemetry import turn_span
from shared.turn_ending import TurnEnding
from workers import retry
from workers.broker_watch import BrokerWatch
from workers.context import utc_now
from workers.metrics import WorkerMetrics
from workers.webhooks.sweep import WebhookSweeper

__all__ = ["AdmissionPlaces", "Reconciler", "ReconcilerStats", "frontier"]

logger = logging.getLogger(__name__)

_BATCH = 500
_MAX_BATCHES_PER_SCAN = 20
_PRUNE_AFTER_SECONDS = 86400.0
_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, SQLAlchemyError, *SEND_ERRORS)


class AdmissionPlaces(Protocol):
    """What the reconciler needs of admission (``shared.state.admission.AdmissionQueue``)."""

    def where(self, org_id: str, turn_ids: list[str]) -> dict[str, Place | None]:
        """Whether each turn is held, in flight, or neither."""

    def hold(self, org_id: str, turn_ids: list[str]) -> None:
        """Hold turns again, at the back of their organisation's queue."""


@dataclass
class ReconcilerStats:
    """What the reconciler did and what it cost, since it started."""

    scans: int = 0
    checked: int = 0
    """Overdue turns looked at."""
    moving: int = 0
    """Of those, turns whose marker showed them moving (their deadline was moved up)."""
    redriven: int = 0
    failed: int = 0
    released: int = 0
    """Parked messages sent when due."""
    redis_calls: int = 0
    db_calls: int = 0
    cpu_seconds: float = 0.0
    """CPU time of the scans (this thread only)."""


class Reconciler:
    """One copy of the reconciler; :meth:`run` loops until told to stop."""

    def __init__(
        self,
        *,
        settings: Settings,
        turns: TurnRepository,
        states: TurnStates,
        in_flight: InFlightMarkers,
        steps: StepSender,
        leader: Leader,
        ending: TurnEnding,
        broker: BrokerWatch | None = None,
        clock: Callable[[], datetime] = utc_now,
        metrics: WorkerMetrics | None = None,
        webhooks: WebhookSweeper | None = None,
        admission: AdmissionPlaces | None = None,
    ) -> None:
        """Build one copy.

        Args:
            settings: deadlines, interval, re-drive limit.
            turns: the turn repository (deadlines, checkpoints).
            states: the turns' states in Redis (the frontier they record; the reconciler loads and drops them).
            in_flight: the turns' in-flight markers.
            steps: sends re-driven messages and the parked ones that are due.
            leader: the leader lease (``RECONCILER_LEADER_KEY``): only its holder scans.
            ending: ends a turn given up on, with all its cleanup (``shared.turn_ending``).
            broker: the broker, when it is Redis (its sentinel, the first step's queue); None otherwise.
            clock: the wall clock.
            metrics: counts scans, re-drives and turns given up on (a private set when None).
            webhooks: sends the due webhook deliveries at each scan; None: no webhooks here.
            admission: the admission sets: a batch turn held there is waiting, not stalled, one that
                is neither held nor released is held again (None: no admission control).
        """
        self._settings = settings
        self._turns = turns
        self._states = states
        self._in_flight = in_flight
        self._steps = steps
        self._broker = broker
        self._clock = clock
        self._metrics = metrics or WorkerMetrics()
        self._webhooks = webhooks
        self._admission = admission
        self._ending = ending
        self._lease = leader
        self.stats = ReconcilerStats()

    def run(self, stop: threading.Event) -> None:
        """Release due messages about every second and, while leading, scan every interval; until ``stop``."""
        interval = self._settings.reconciler_interval_seconds
        next_scan = 0.0
        while not stop.is_set():
            try:
                self.release_due()
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + interval
                    if self.lead():
                        self.scan()
                        self.sweep_webhooks()
            except _ERRORS as exc:
                logger.warning("reconciler: %s: %s; trying again", type(exc).__name__, exc)
            except Exception:  # a bug must not end the one thing that ends stranded turns
                logger.exception("reconciler: unexpected error; trying again")
            stop.wait(min(1.0, interval))

    def lead(self) -> bool:
        """Take or keep the leader lease; whether this copy is the active one."""
        self.stats.redis_calls += 1
        return self._lease.hold(max(3 * self._settings.reconciler_interval_seconds, 10.0))

    def release_due(self) -> int:
        """Send the parked messages that are due."""
        sent = self._steps.release_due(now=self._clock().timestamp())
        self.stats.released += sent
        return sent

    def sweep_webhooks(self) -> int:
        """Send the webhook deliveries that are due (none without a sweeper); how many were sent."""
        if self._webhooks is None:
            return 0
        sent = self._webhooks.sweep(self._clock())
        self.stats.db_calls += 1
        return sent

    def scan(self) -> None:
        """Look at every turn past its deadline: move the deadline of those still moving, re-drive the rest."""
        cpu = time.thread_time()
        before = (
            self.stats.checked,
            self.stats.redriven,
            self.stats.failed,
            self.stats.redis_calls,
            self.stats.db_calls,
        )
        self._check_broker()
        backlog = self._first_step_backlog()
        for _ in range(_MAX_BATCHES_PER_SCAN):
            if self._scan_batch(queue_drained=backlog == 0) < _BATCH:
                break
        self._in_flight.prune_markers(before=self._clock().timestamp() - _PRUNE_AFTER_SECONDS)
        self.stats.redis_calls += 1
        self.stats.scans += 1
        self._metrics.count_scan()
        used = time.thread_time() - cpu
        self.stats.cpu_seconds += used
        checked, redriven, failed, redis_calls, db_calls = (
            now - then
            for now, then in zip(
                (
                    self.stats.checked,
                    self.stats.redriven,
                    self.stats.failed,
                    self.stats.redis_calls,
                    self.stats.db_calls,
                ),
                before,
                strict=True,
            )
        )
        if checked:
            logger.info(
                "reconciler: %d overdue turn(s): %d still moving, %d re-driven, %d failed; %.1f ms CPU, "
                "%d Redis and %d database round trips",
                checked, checked - redriven - failed, redriven, failed, used * 1000, redis_calls, db_calls,
            )  # fmt: skip

    def _scan_batch(self, *, queue_drained: bool) -> int:
        now = self._clock()
        overdue = self._turns.overdue(now=now, limit=_BATCH)
        alive = self._in_flight.alive_until([turn.turn_id for turn in overdue]) if overdue else {}
        self.stats.db_calls += 1
        self.stats.redis_calls += 1 if overdue else 0
        self.stats.checked += len(overdue)
        moving: dict[str, datetime] = {}
        overdue = self._waiting_admission(overdue, now, moving)
        for turn in overdue:
            until = alive.get(turn.turn_id)
            vouched = until is not None and until > now.timestamp()
            if vouched and not (queue_drained and turn.status is TurnStatus.QUEUED):
                assert until is not None
                moving[turn.turn_id] = self._look_again(turn, until, now)
            else:
                self._stalled(turn, now)
        if moving:
            self._turns.set_deadlines(moving)
            self.stats.db_calls += 1
            self.stats.moving += len(moving)
        return len(overdue)

    def _look_again(self, turn: InFlightTurn, until: float, now: datetime) -> datetime:
        """When to look at a turn that its marker vouches for (alive until ``until``) again.

        A running turn's marker is pushed forward by every save and lease renewal: its deadline moves up
        to the marker. A queued turn's marker vouches for a first message that may wait behind a backlog
        for the whole queued window, or may have been lost (a worker killed as it took it, a Redis
        failover): its deadline moves up one deadline at a time, so the turn is judged again as soon as
        the first step's queue drains, not when the window ends.
        """
        marker = datetime.fromtimestamp(until, UTC)
        if turn.status is TurnStatus.QUEUED:
            return min(marker, now + timedelta(seconds=self._deadline()))
        return marker

    def _waiting_admission(
        self, overdue: list[InFlightTurn], now: datetime, moving: dict[str, datetime]
    ) -> list[InFlightTurn]:
        """The overdue turns left to judge once those waiting for admission are set aside in ``moving``.

        A batch turn not yet started that is held is waiting its turn; one neither held nor released
        (Redis restarted empty) is held again, at the back of its organisation's queue, rather than
        sent past the admission limit. A released one is judged like any other turn.
        """
        if self._admission is None:
            return overdue
        waiting = [t for t in overdue if t.status is TurnStatus.QUEUED and t.batch_id is not None and t.round == 0]
        by_org: dict[str, list[str]] = {}
        for turn in waiting:
            by_org.setdefault(turn.org_id, []).append(turn.turn_id)
        set_aside: set[str] = set()
        until = now + timedelta(seconds=self._deadline())
        for org_id, turn_ids in by_org.items():
            places = self._admission.where(org_id, turn_ids)
            lost = [turn_id for turn_id in turn_ids if places.get(turn_id) is None]
            if lost:
                logger.warning("holding %d batch turn(s) of %s again (not held, not released)", len(lost), org_id)
                self._in_flight.mark_alive(lost, until=now.timestamp() + self._settings.reconciler_queued_seconds)
                self._admission.hold(org_id, lost)
            self.stats.redis_calls += 2 if lost else 1
            for turn_id in turn_ids:
                if places.get(turn_id) != "in_flight":
                    moving[turn_id] = until
                    set_aside.add(turn_id)
        return [turn for turn in overdue if turn.turn_id not in set_aside]

    def redrive(self, turn: InFlightTurn, now: datetime) -> None:
        """Send the turn's frontier message again (from Redis, else its checkpoint, else its first step)."""
        state = self._states.load(turn.turn_id)
        raw = self._turns.load_snapshot(turn.turn_id)
        checkpoint = None if raw is None else TurnState.model_validate(raw)
        envelope, source = frontier(turn, state, checkpoint)
        if source == "checkpoint" and state is not None:
            self._states.drop(turn.turn_id)  # older than the checkpoint: the step carries on from the checkpoint
            self.stats.redis_calls += 1
        with turn_span(turn.turn_id, "reconciler re-drive", source=source, step_key=envelope.step_key):
            self._steps.send([envelope])
        window = self._settings.reconciler_queued_seconds if turn.status is TurnStatus.QUEUED else self._deadline()
        self._in_flight.mark_alive([turn.turn_id], until=now.timestamp() + window)
        self._turns.note_redrive(turn.turn_id, deadline_at=now + timedelta(seconds=self._deadline()))
        self.stats.redis_calls += 2  # load the state, set the marker (plus the message itself)
        self.stats.db_calls += 2  # load the checkpoint, count the re-drive
        self.stats.redriven += 1
        self._metrics.count_redrive(source)
        logger.warning(
            "re-driving turn %s (%s, re-drive %d) from %s at %s",
            turn.turn_id, turn.status.value, turn.redrives + 1, source, envelope.step_key,
        )  # fmt: skip

    def _stalled(self, turn: InFlightTurn, now: datetime) -> None:
        """Re-drive a stalled turn, or give it up, as the retry policy decides."""
        decision = retry.decide(
            retry.Trouble.STALLED,
            settings=self._settings,
            now=now,
            rand=0.0,  # the row has no jitter
            attempt=turn.redrives,
            message="the turn did not move",
        )
        if isinstance(decision, retry.GiveUp):
            self._give_up(turn, decision.error)
        else:
            self.redrive(turn, now)

    def _give_up(self, turn: InFlightTurn, error: ErrorInfo) -> None:
        logger.error("turn %s: %s; failing it", turn.turn_id, error.message)
        ended = self._ending.end(turn.turn_id, error, only_if=TurnStatus.in_flight())
        self.stats.db_calls += 1
        if ended is not None:
            self.stats.redis_calls += 3  # at most: the event, the marker, the admission slot
            self.stats.failed += 1

    def _first_step_backlog(self) -> int | None:
        """Messages waiting in the queue of every turn's first step; None when the broker is not Redis."""
        if self._broker is None:
            return None
        self.stats.redis_calls += 1
        return self._broker.first_step_backlog()

    def _check_broker(self) -> None:
        if self._broker is None:
            return
        self.stats.redis_calls += 1  # the sentinel's check (two more, uncounted, the rare time it is set again)
        if self._broker.lost_messages():
            logger.warning("the broker lost its messages (its sentinel vanished): every turn in flight is re-driven")
            self._in_flight.forget_all()

    def _deadline(self) -> int:
        return self._settings.reconciler_deadline_seconds


def frontier(turn: InFlightTurn, state: TurnState | None, checkpoint: TurnState | None) -> tuple[TurnEnvelope, str]:
    """The message that carries ``turn`` on, and where it came from (``redis``, ``checkpoint`` or ``start``).

    The newest of the recorded next steps of this round wins (Redis on a tie); with none, the
    round's first step.
    """
    options: list[tuple[TurnEnvelope, str]] = []
    for source, candidate in (("redis", state), ("checkpoint", checkpoint)):
        if candidate is None or candidate.next_envelope is None:
            continue
        envelope = TurnEnvelope.model_validate(candidate.next_envelope)
        if envelope.round == turn.round:
            options.append((envelope, source))
    if options:
        return max(options, key=lambda option: (option[0].hop, option[1] == "redis"))
    return first_step(turn.turn_id, batch=turn.batch_id is not None, round_=turn.round), "start"
