"""AdmissionScheduler: releases held batch turns round-robin across organisations (issue 14, item 2).

The gateway holds a batch's turns in their organisation's admission queue
(``shared.state.admission``). The active scheduler releases them, one turn per organisation per
round, while each organisation has fewer than its cap of turns in flight (``APTIX_ORG_MAX_IN_FLIGHT``, or
its own from ``org_settings``, read every few seconds: ``aptix orgs set --max-in-flight``), and sends
their first messages (``BATCH_START_PRIORITY``, :func:`~shared.models.envelope.first_step`, the
message the gateway sends an interactive turn). It wakes when turns are held or a turn in flight
ends (a Redis nudge the gateway and the worker's last state save push), and at least twice a second.

Crash safety: a release moves the turns and writes a releasing note in one atomic step, and the note
is deleted only once the messages are sent (in the first round trip of the next release, a wake-up
later: no round trip of its own); a note older than 5 s (its scheduler died in between) is sent
again by whichever copy finds it. A duplicate first message is harmless: the driver takes the
step's lease and skips a step recorded in ``steps_done`` (``workers.driver``), so no step runs twice.

The window (``workers.admission_window``, unless ``APTIX_ADMISSION_TARGET_DELAY_MS`` is 0): every half
second the active copy reads the workers' dispatch-delay reports and resizes how many turns may be in
flight in all; a release never passes it, whatever room the organisations' caps leave.

The sweep: every few seconds the active copy drops from the in-flight sets the turns that ended or
paused without saying so (a worker that died after the commit, a turn cancelled while it was held,
a turn failed outside any step), so a lost removal costs capacity for seconds only.

A copy runs in the main process of every ``aptix worker`` (``--no-scheduler`` turns it off) and as
``aptix scheduler``; one copy at a time is active, chosen through a Redis lease (``LeaderLease``). Two
active at once do no harm: a turn is moved to in flight by one atomic script, once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping

import redis
from sqlalchemy.exc import SQLAlchemyError

from shared.db.turns import TurnRepository
from shared.models.envelope import first_step
from shared.models.turn import TurnStatus
from shared.settings import Settings
from shared.state.admission import AdmissionQueue, Release
from shared.state.leader import Leader
from shared.step_sender import SEND_ERRORS, StepSender
from workers.admission_window import CONTROL_SECONDS, AdmissionWindow, combined_delay
from workers.metrics import WorkerMetrics

__all__ = ["AdmissionScheduler"]

logger = logging.getLogger(__name__)

_RELEASE_BATCH = 200
"""Turns one release script moves at most (the scheduler loops while it releases some)."""
_WAIT_SECONDS = 0.5
"""Longest sleep between two looks when nothing nudges the scheduler."""
_COALESCE_SECONDS = 0.05
"""After a nudge, how long to let more turns end before releasing for all of them (one step, not one each)."""
_LEASE_SECONDS = 5.0
_SWEEP_EVERY_SECONDS = 5.0
_SWEEP_AFTER_SECONDS = 5.0
"""An in-flight entry this old is checked against the database by the sweep."""
_UNRECORDED_AFTER_SECONDS = 120.0
"""An in-flight turn the database does not know (its batch rolled back) is dropped after this long."""
_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, SQLAlchemyError, *SEND_ERRORS)
_MOVING = (TurnStatus.QUEUED, TurnStatus.RUNNING)


class AdmissionScheduler:
    """One copy of the admission scheduler; :meth:`run` loops until told to stop."""

    def __init__(
        self,
        *,
        settings: Settings,
        admission: AdmissionQueue,
        turns: TurnRepository,
        steps: StepSender,
        leader: Leader,
        metrics: WorkerMetrics | None = None,
        clock: Callable[[], float] = time.time,
        caps: Callable[[], Mapping[str, int]] | None = None,
        window: AdmissionWindow | None = None,
    ) -> None:
        """Build one copy.

        Args:
            settings: ``APTIX_ORG_MAX_IN_FLIGHT``.
            admission: the held and in-flight sets.
            turns: the turn repository (the sweep reads turns' statuses).
            steps: sends the released turns' first steps (a release's in one broker round trip).
            leader: the leader lease (``SCHEDULER_LEADER_KEY``): only its holder releases turns.
            metrics: counts releases and shows the sets (a private set when None).
            clock: the wall clock (Unix time).
            caps: the organisations with an admission cap of their own (``org_settings``, cached), each
                with its cap; every other organisation's is ``APTIX_ORG_MAX_IN_FLIGHT``.
            window: the most turns in flight in all, resized from the workers' dispatch delays (None: the
                caps alone).
        """
        self._caps = caps
        self._window = window
        self._next_resize = 0.0
        self._settings = settings
        self._admission = admission
        self._turns = turns
        self._steps = steps
        self._metrics = metrics or WorkerMetrics()
        self._clock = clock
        self._lease = leader
        self._lease_renewed = 0.0
        self._leading = False
        self._next_sweep = 0.0
        self._next_republish = 0.0
        self._shown: set[str] = set()
        self._sent: list[Release] = []
        """Releases whose first messages were sent and whose notes are not deleted yet (the next release does it)."""
        self.released = 0
        self.republished = 0

    def run(self, stop: threading.Event) -> None:
        """Release turns as slots free up while leading; until ``stop``."""
        logger.info("admission scheduler %s running (at most %d turns in flight per organisation)",
                    self._lease.owner, self._settings.org_max_in_flight)  # fmt: skip
        while not stop.is_set():
            try:
                if self.lead():
                    self.step()
                    if self._admission.wait(_WAIT_SECONDS):
                        # Let the turns ending about now nudge too, and release for them all in one step.
                        stop.wait(_COALESCE_SECONDS)
                else:
                    self.settle_sent()
                    stop.wait(1.0)
            except _ERRORS as exc:
                logger.warning("admission scheduler: %s: %s; trying again", type(exc).__name__, exc)
                stop.wait(1.0)
            except Exception:  # a bug must not stop every batch turn from ever starting
                logger.exception("admission scheduler: unexpected error; trying again")
                stop.wait(1.0)
        with contextlib.suppress(redis.RedisError):  # else another copy sends them again, a harmless duplicate
            self.settle_sent()
        with contextlib.suppress(redis.RedisError):  # else it lapses by itself
            self._lease.give_up()

    def lead(self) -> bool:
        """Take or keep the leader lease (renewed about every second); whether this copy is active."""
        now = time.monotonic()
        if now - self._lease_renewed >= 1.0:
            leading = self._lease.hold(_LEASE_SECONDS)
            self._lease_renewed = now if leading else 0.0
            if leading != self._leading:
                logger.info("admission scheduler %s is %s", self._lease.owner, "active" if leading else "standing by")
            self._leading = leading
        return self._leading

    def step(self) -> int:
        """Send stale releases again, release what the limits allow, and sweep when due; turns released."""
        now = self._clock()
        if now >= self._next_republish:  # a note is stale after seconds: once a second is enough
            self._next_republish = now + 1.0
            self.republish_stale(now)
        if self._window is not None and now >= self._next_resize:
            self._next_resize = now + CONTROL_SECONDS
            self.resize(self._window, now)
        released = self.release(now)
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_EVERY_SECONDS
            self.sweep(now)
            self.show()
        return released

    def release(self, now: float) -> int:
        """Release held turns until no organisation may have more in flight; how many."""
        caps = self._caps() if self._caps is not None else None
        released = 0
        while True:
            release = self._admission.release(
                cap=self._settings.org_max_in_flight, limit=_RELEASE_BATCH, now=now, caps=caps,
                window=None if self._window is None else self._window.size, settled=self._sent,
            )  # fmt: skip
            self._sent = []  # their notes went in the release's first round trip (kept when it raised)
            if release is None:
                return released
            self._send(release)
            released += len(release.turn_ids)
            self.released += len(release.turn_ids)
            self._metrics.count_released("released", len(release.turn_ids))
            if len(release.turn_ids) < _RELEASE_BATCH:  # the script stopped at the limits, not at the batch size
                return released

    def resize(self, window: AdmissionWindow, now: float) -> int:
        """Resize ``window`` from the workers' dispatch-delay reports and the turns held and in flight; its size."""
        delay = combined_delay(self._admission.delays(now=now))
        counts = self._admission.counts().values()
        size = window.update(delay, in_flight=sum(c.in_flight for c in counts), held=sum(c.held for c in counts))
        self._metrics.show_window(size, delay)
        return size

    def republish_stale(self, now: float) -> int:
        """Send again the turns of releasing notes their scheduler left behind; how many."""
        sent = 0
        ours = {release.release_id for release in self._sent}  # sent already, deleted by the next release
        for release in self._admission.stale_releases(now=now):
            if release.release_id in ours:
                continue
            logger.warning("admission: sending %d released turn(s) again (their scheduler stopped before sending)",
                           len(release.turn_ids))  # fmt: skip
            self._send(release)
            sent += len(release.turn_ids)
            self.republished += len(release.turn_ids)
            self._metrics.count_released("republished", len(release.turn_ids))
        return sent

    def sweep(self, now: float) -> int:
        """Drop from the in-flight sets turns that ended or paused without saying so; how many."""
        dropped = 0
        for org_id in self._admission.counts():
            entries = self._admission.in_flight_since(org_id, before=now - _SWEEP_AFTER_SECONDS)
            if not entries:
                continue
            statuses = self._turns.statuses([turn_id for turn_id, _ in entries])
            ended = [
                turn_id
                for turn_id, since in entries
                if (turn_id in statuses and statuses[turn_id] not in _MOVING)
                or (turn_id not in statuses and since < now - _UNRECORDED_AFTER_SECONDS)
            ]
            dropped += self._admission.finished(org_id, ended)
        if dropped:
            logger.info("admission: %d turn(s) that ended unannounced no longer count in flight", dropped)
        return dropped

    def show(self) -> None:
        """Set the ``aptix_admission_turns`` gauges from the sets as they stand."""
        counts = {org: (c.held, c.in_flight) for org, c in self._admission.counts().items()}
        self._shown = self._metrics.show_admission(counts, shown=self._shown)

    def settle_sent(self) -> None:
        """Delete the notes of the releases sent since the last release (one round trip; none when there are none)."""
        self._admission.settle(*self._sent)
        self._sent = []

    def _send(self, release: Release) -> None:
        self._steps.send([first_step(turn_id, batch=True) for turn_id in release.turn_ids])
        self._sent.append(release)
