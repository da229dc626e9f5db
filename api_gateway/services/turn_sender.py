"""TurnSender: what the gateway does around sending a turn's first step: hold it for fair admission or send it now.

A batch's turns wait in their organisation's admission queue (``shared.state.admission``) until the
admission scheduler releases them; an interactive turn and a re-entry are sent at once
(``shared.step_sender.StepSender``, the one way a step is sent) and counted in flight. Every send
marks the turns in flight for the reconciler first. A refusal of the broker or of Redis is
:class:`~api_gateway.services.errors.Unavailable`, raised inside the caller's block of
``TurnRepository.creating`` (``accepting_tool_results``, ``BatchRepository.creating``), before the
commit: nothing is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from redis import RedisError

from api_gateway.metrics import GatewayMetrics
from api_gateway.services.errors import Unavailable
from shared.models.envelope import TurnEnvelope, first_step
from shared.settings import Settings
from shared.state import InFlightMarkers
from shared.state.admission import AdmissionQueue, Admitted
from shared.step_sender import SEND_ERRORS, StepSender
from shared.telemetry import active_telemetry, turn_accepted

__all__ = ["TurnSender", "unavailable"]

logger = logging.getLogger(__name__)

_SEND_CHUNK = 1000
"""Turns per marker write and per hold or producer batch."""


class TurnSender:
    """Send or hold first steps and re-entries; one per gateway, owned by its ``TurnService``."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: InFlightMarkers,
        steps: StepSender,
        clock: Callable[[], datetime],
        metrics: GatewayMetrics,
        admission: AdmissionQueue | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._steps = steps
        self._clock = clock
        self._metrics = metrics
        self._admission = admission

    def send_new(self, turn_ids: list[str], *, batch: bool, refused: str, org_id: str) -> None:
        """Send each new interactive turn's first step, or hold a batch's turns for admission; mark them
        in flight for the reconciler.

        A batch's turns go to ``org_id``'s admission queue (``shared.state.admission``): the admission
        scheduler sends their first steps as the organisation's turns in flight drop below
        ``APTIX_ORG_MAX_IN_FLIGHT``, round-robin across organisations. An interactive turn is never
        held: its first step is sent at once, and it counts in the organisation's turns in flight: its
        marker, its count and, with the broker on the state store's Redis server, its message in one
        round trip. Without an admission queue (``admission=None``) every turn is sent at once.

        A first message may wait behind a backlog (held, or in the broker): the marker says so for
        ``APTIX_RECONCILER_QUEUED_SECONDS``, so the reconciler does not send it twice meanwhile (a
        broker that loses its messages loses the markers with them, or the reconciler notices and
        drops them; a held turn that Redis lost is held again by the reconciler).

        Args:
            turn_ids: the turns, just written and not yet committed.
            batch: whether they are a batch's (held for admission, then sent at a lower priority).
            refused: what the client is told was not accepted when this fails ("the turn was not accepted").
            org_id: the turns' organisation.

        Raises:
            Unavailable: the broker or the state store refused (the caller's transaction then rolls back).
        """
        now = self._clock().timestamp()
        until = now + self._settings.reconciler_queued_seconds
        try:
            # A batch of 100,000 turns goes out in chunks: one marker write and one hold or producer per
            # chunk, never 100,000 envelopes in memory at once.
            for start in range(0, len(turn_ids), _SEND_CHUNK):
                chunk = turn_ids[start : start + _SEND_CHUNK]
                _start_traces(chunk)
                if batch and self._admission is not None:
                    self._store.mark_alive(chunk, until=until)
                    self._admission.hold(org_id, chunk)
                    continue
                self._send([first_step(turn_id, batch=batch) for turn_id in chunk], until=until, org_id=org_id, now=now)
        except SEND_ERRORS as exc:
            logger.error("could not enqueue %d turn(s): %s", len(turn_ids), exc)
            raise unavailable(refused) from exc
        self._metrics.turns_accepted.labels("batch" if batch else "single").inc(len(turn_ids))

    def withdraw(self, turn_ids: list[str], *, org_id: str) -> None:
        """Take ``org_id``'s held turns out of the admission queue: they will not be sent (batch cancel).

        Turns already released are untouched (their cancel flag stops them); a turn not held is
        ignored. Without an admission queue, nothing is held and this does nothing.

        Raises:
            Unavailable: Redis refused.
        """
        if self._admission is None or not turn_ids:
            return
        try:
            self._admission.withdraw(org_id, turn_ids)
        except RedisError as exc:
            logger.error("could not withdraw %d held turn(s): %s", len(turn_ids), exc)
            raise unavailable("the turns were not withdrawn") from exc

    def send_reentry(self, turn_id: str, *, round_: int, batch: bool, org_id: str) -> None:
        """Send the re-entry of a turn whose client tool results were accepted (round ``round_``).

        Raises:
            Unavailable: the broker or the state store refused (the caller's transaction then rolls back).
        """
        envelope = first_step(turn_id, batch=batch, round_=round_)
        # A re-entry is a running turn: its marker covers the usual deadline, not a batch backlog.
        now = self._clock().timestamp()
        until = now + self._settings.reconciler_deadline_seconds
        try:
            self._send([envelope], until=until, org_id=org_id, now=now)  # never held: it runs again at once
        except SEND_ERRORS as exc:
            logger.error("could not enqueue the re-entry of turn %s: %s", turn_id, exc)
            raise unavailable("the results were not accepted") from exc

    def _send(self, envelopes: list[TurnEnvelope], *, until: float, org_id: str, now: float) -> None:
        """Mark the turns of ``envelopes`` in flight until ``until``, count them in ``org_id``'s turns in flight from
        ``now`` (with an admission queue), and send their messages: all in one Redis round trip when the broker is
        the state store's server (the markers' write pushes the messages), else the messages in a second.

        Raises:
            Exception: one of ``SEND_ERRORS``.
        """
        turn_ids = [envelope.turn_id for envelope in envelopes]
        admitted = None if self._admission is None else Admitted(org_id, now)
        pushes = [self._steps.push(envelope) for envelope in envelopes]
        if all(push is not None for push in pushes):
            self._store.mark_alive(turn_ids, until=until, admitted=admitted, pushes=[p for p in pushes if p])
            return
        self._store.mark_alive(turn_ids, until=until, admitted=admitted)
        self._steps.send(envelopes)


def _start_traces(turn_ids: list[str]) -> None:
    """With telemetry on, each new turn's root span, linked to the request that accepted it (``shared.telemetry``).

    Nothing for a turn whose request is its root already (``POST /v1/turns``). A batch's turns get a
    root of their own each: only the request can link to it, and their first steps are sent after
    it ends, inside each turn's trace (``shared.step_sender``), by this request or, for a held turn,
    later by the admission scheduler in another process.
    """
    if active_telemetry() is None:
        return
    for turn_id in turn_ids:
        with turn_accepted(turn_id):
            pass


def unavailable(refused: str) -> Unavailable:
    """The 503 a refusal of the broker or the state store gives, saying what was ``refused``."""
    return Unavailable(f"the task broker or the state store is unavailable; {refused}")
