"""TurnEnding: the one way a turn ends early (cancelled, timed out, failed outside a step, given up on).

A turn ends normally in a worker's ``persist`` step: its commit writes the end (and its webhook
event, which the driver then sends), and the driver's last state save takes the turn out of flight
(``TurnStates.save``: in-flight marker and, as the driver asks, admission slot, in the same script).
Every other end goes through :meth:`TurnEnding.end` (one turn) or :meth:`TurnEnding.cancel_queued` (a
batch's turns not started yet, at once), which do the whole of it, in this order:

1. The database writes the end, with the turn's webhook event in the same transaction (the outbox:
   ``TurnRepository.finish_early`` / ``cancel_queued``). A turn no longer in a status the caller
   allows is left alone, and nothing below happens for it: whoever ended it cleaned up.
2. The webhook deliveries that transaction recorded go to the webhooks queue (``WebhookSender``).
3. The end is counted (``aptix_turns_finished_total``) and its round-end event (``turn.cancelled``,
   ``turn.failed``) goes to the turn's event log.
4. Redis takes the turn out of flight: a cancelled turn's cancel flag (its remaining steps stop at
   their start) with its in-flight marker in one round trip, a failed turn's marker alone; then its
   admission slot, held or in flight, in one more.

Who ends turns early: the gateway's ``TurnService`` (a client's cancel, a batch's cancel, the
client-tool timeout), the worker driver (a failure outside any step) and the reconciler (a turn that
does not move after its re-drives). The status follows from the error: ``cancelled`` for
:data:`CANCELLED_BY_CLIENT`, ``failed`` for any other.

The database is the truth: once it says how the turn ended, a Redis that does not answer costs only
the rest, and is logged. A gateway following the turn writes the missing event itself
(``shared.turn_events.append_ended``), the marker lapses, the admission scheduler's sweep frees the
slot, and a step that runs anyway finds the turn ended at its commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import redis

from shared.db.records import Ended, TurnRecord
from shared.db.turns import TurnRepository
from shared.models.turn import UNFINISHED_STATUSES, TurnStatus
from shared.result import ErrorCode, ErrorInfo
from shared.state.store import CancelFlags, InFlightMarkers
from shared.turn_events import TurnEventLog, append_ended
from shared.webhooks.sender import WebhookSender

__all__ = ["CANCELLED_BY_CLIENT", "CANCEL_FLAG_SECONDS", "AdmissionSlots", "EndCounter", "TurnEnding"]

logger = logging.getLogger(__name__)

CANCELLED_BY_CLIENT = ErrorInfo(code=ErrorCode.CANCELLED, message="the turn was cancelled by the client")
"""The error of every cancelled turn (one turn's cancel, a batch's)."""
CANCEL_FLAG_SECONDS = 7 * 86400
"""How long the state store keeps a cancelled turn's flag (longer than any turn runs)."""


class AdmissionSlots(Protocol):
    """What ending a turn needs of admission (``shared.state.admission.AdmissionQueue``)."""

    def leave(self, org_id: str, turn_ids: Sequence[str]) -> int:
        """The turns are neither held nor in flight any more."""


class EndCounter(Protocol):
    """The process's metrics (the gateway's or a worker's)."""

    def count_ended(self, status: TurnStatus, error: ErrorInfo) -> None:
        """Count a turn this process ended (after its end was written)."""


@dataclass(frozen=True, slots=True)
class TurnEnding:
    """Ends turns early with all their cleanup; built from a process's ports."""

    turns: TurnRepository
    """Writes the end (and the webhook event with it)."""
    cancel_flags: CancelFlags
    """The cancel flags (a cancel also removes the turn's in-flight marker)."""
    in_flight: InFlightMarkers
    """The in-flight markers."""
    metrics: EndCounter
    """Counts each end."""
    clock: Callable[[], datetime]
    """The time each end is written with."""
    events: TurnEventLog | None = None
    """The turns' event logs (None: no event, the reconciler's unit tests)."""
    admission: AdmissionSlots | None = None
    """The organisations' admission slots (None: no admission control)."""
    webhook_sender: WebhookSender | None = None
    """Sends the webhook deliveries an end recorded (None: this process sends none; the sweep does)."""

    def end(
        self, turn_id: str, error: ErrorInfo, *, only_if: Collection[str] = UNFINISHED_STATUSES
    ) -> TurnRecord | None:
        """End one turn with ``error`` if its status is in ``only_if``, and clean up after it.

        Args:
            turn_id: the turn.
            error: why it ended: :data:`CANCELLED_BY_CLIENT` cancels it, any other error fails it.
            only_if: the statuses it may be in (a timeout ends only a paused turn, the reconciler
                only one in flight).

        Returns:
            The ended turn, or None when it was in none of those statuses (nothing was done).
        """
        status = TurnStatus.CANCELLED if error.code is ErrorCode.CANCELLED else TurnStatus.FAILED
        ended = self.turns.finish_early(turn_id, status=status, error=error, now=self.clock(), only_if=only_if)
        if ended is None:
            return None
        self._clean_up(ended, status, error)
        return ended.records[0]

    def cancel_queued(self, turn_ids: Sequence[str]) -> list[TurnRecord]:
        """Cancel those of ``turn_ids`` not started yet, at once (a batch's cancel), and clean up after them.

        One bulk update in the database (a turn that started meanwhile is left alone), then what
        :meth:`end` does for each cancelled turn, with the Redis writes in bulk.

        Returns:
            The turns this call cancelled.
        """
        cancelled = self.turns.cancel_queued(turn_ids, error=CANCELLED_BY_CLIENT, now=self.clock())
        if cancelled.records:
            self._clean_up(cancelled, TurnStatus.CANCELLED, CANCELLED_BY_CLIENT)
        return cancelled.records

    def _clean_up(self, ended: Ended, status: TurnStatus, error: ErrorInfo) -> None:
        if self.webhook_sender is not None:
            self.webhook_sender.send(ended.deliveries)
        for record in ended.records:
            self.metrics.count_ended(status, error)
            if self.events is not None:
                append_ended(self.events, record)
        turn_ids = [record.turn_id for record in ended.records]
        try:
            if status is TurnStatus.CANCELLED:
                self.cancel_flags.cancel_many(turn_ids, ttl_seconds=CANCEL_FLAG_SECONDS)
            else:
                for turn_id in turn_ids:
                    self.in_flight.forget(turn_id)
            if self.admission is not None:
                for org_id, of_org in _by_org(ended.records).items():
                    self.admission.leave(org_id, of_org)
        except redis.RedisError as exc:
            logger.warning(
                "could not take %d %s turn(s) out of flight in Redis (%s); the database says how they ended",
                len(turn_ids), status.value, exc,
            )  # fmt: skip


def _by_org(records: list[TurnRecord]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in records:
        found.setdefault(record.org_id, []).append(record.turn_id)
    return found
