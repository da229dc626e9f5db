"""TurnService: what the gateway does to a turn — record, read, resume, cancel and expire it.

Routes speak HTTP and call this; it speaks in repositories, the state store and the step sender, and
refuses requests with the ``ServiceError``s of ``api_gateway.services.errors``.

Every change that needs a message on the broker sends it before the database commits: the
repository writes in a transaction it holds open for a block of this service's (``with
turns.creating(turn) as created:``), the block sends through the ``TurnSender``, and the commit
follows when the block ends. If the broker refuses, the block raises ``Unavailable``, nothing is
recorded and the client gets 503; if the gateway dies after sending, the message finds no turn and
is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from redis import RedisError
from starlette.concurrency import run_in_threadpool

from api_gateway.ids import is_turn_id
from api_gateway.metrics import GatewayMetrics
from api_gateway.services.errors import Conflict, NotFound
from api_gateway.services.limits import OrgLimitsService
from api_gateway.services.turn_checks import check_turn_request
from api_gateway.services.turn_sender import TurnSender
from api_gateway.services.webhook_service import WebhookService
from shared.db.records import TurnRecord
from shared.db.sessions import SessionRepository
from shared.db.turns import IdempotencyConflict, NewTurn, SessionBusy, TurnRepository
from shared.models.trace import TraceStep
from shared.models.turn import ToolResultsRequest, TurnRequest, TurnStatus
from shared.modes import ModeCatalog
from shared.openai.extras import TurnExtras
from shared.result import ErrorCode, ErrorInfo
from shared.settings import Settings
from shared.state import CancelFlags, InFlightMarkers, TurnStates
from shared.state.admission import AdmissionQueue
from shared.step_sender import StepSender
from shared.turn_ending import CANCELLED_BY_CLIENT, TurnEnding
from shared.turn_events import TurnEventLog
from shared.webhooks import WebhookSender

__all__ = ["TurnService"]

logger = logging.getLogger(__name__)


class TurnService:
    """Record, read, resume, cancel and expire turns; built once per gateway from its ports."""

    def __init__(
        self,
        *,
        settings: Settings,
        turns: TurnRepository,
        sessions: SessionRepository,
        catalog: ModeCatalog,
        states: TurnStates,
        cancel_flags: CancelFlags,
        in_flight: InFlightMarkers,
        events: TurnEventLog,
        steps: StepSender,
        clock: Callable[[], datetime],
        metrics: GatewayMetrics,
        webhooks: WebhookService | None = None,
        admission: AdmissionQueue | None = None,
        webhook_sender: WebhookSender | None = None,
        limits: OrgLimitsService | None = None,
    ) -> None:
        self._settings = settings
        self._limits = limits
        self._webhooks = webhooks
        self._turns = turns
        self._sessions = sessions
        self._catalog = catalog
        self._states = states
        self._clock = clock
        self.sender = TurnSender(
            settings=settings, store=in_flight, steps=steps, clock=clock, metrics=metrics, admission=admission
        )
        self._ending = TurnEnding(
            turns=turns, cancel_flags=cancel_flags, in_flight=in_flight, metrics=metrics, clock=clock, events=events,
            admission=admission, webhook_sender=webhook_sender,
        )  # fmt: skip

    def record(
        self,
        body: TurnRequest,
        *,
        org_id: str,
        user_id: str,
        turn_id: str | None = None,
        extras: TurnExtras | None = None,
    ) -> TurnRecord:
        """Accept a turn: record it queued and send its first step, or return the earlier turn of its idempotency key.

        Args:
            body: the request (a new session when ``session_id`` is absent, else a follow-up turn).
            org_id: the caller's organisation.
            user_id: the caller.
            turn_id: the new turn's id, when it was reserved (tracing: ``api_gateway.telemetry``).
            extras: options beyond ``TurnRequest``, recorded with the request (the OpenAI face's).

        Returns:
            The recorded turn (for a replayed idempotency key, the earlier one, as it stands now).

        Raises:
            InvalidRequest: see :func:`~api_gateway.services.turn_checks.check_turn_request`.
            NotFound: ``session_not_found``.
            Conflict: ``session_busy`` (the session has an unfinished turn) or ``idempotency_key_reused``.
            Limited: ``quota_exceeded`` (:meth:`check_quota`).
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        self.check_quota(org_id)
        turn = self.check_request(body, org_id=org_id, user_id=user_id, turn_id=turn_id, extras=extras)
        try:
            with self._turns.creating(turn, now=self._clock(), deadline_at=self.deadline()) as created:
                if created.new:  # a replayed key sends nothing
                    self.sender.send_new(
                        [turn.turn_id], batch=False, refused="the turn was not accepted", org_id=org_id
                    )
        except SessionBusy as exc:
            raise Conflict("session_busy", f"session {turn.session_id!r} has a turn that is not finished") from exc
        except IdempotencyConflict as exc:
            raise Conflict(
                "idempotency_key_reused", "this idempotency_key was used before with a different request"
            ) from exc
        return created.turn

    def check_request(
        self,
        body: TurnRequest,
        *,
        org_id: str,
        user_id: str,
        loc: tuple[str | int, ...] = ("body",),
        batch_id: str | None = None,
        batch_index: int | None = None,
        turn_id: str | None = None,
        check_webhook: bool = True,
        extras: TurnExtras | None = None,
    ) -> NewTurn:
        """Check ``body`` and describe the turn to record; a follow-up's session first loses its overdue turns.

        Args and Raises: as :func:`~api_gateway.services.turn_checks.check_turn_request`, and its ``webhook_url``
        as :meth:`~api_gateway.services.webhook_service.WebhookService.check_url` (unless
        ``check_webhook`` is False: the caller checked it).
        """
        if check_webhook and self._webhooks is not None:
            self._webhooks.check_url(body.webhook_url, org_id=org_id, loc=loc)
        turn = check_turn_request(
            body,
            catalog=self._catalog,
            sessions=self._sessions,
            org_id=org_id,
            user_id=user_id,
            loc=loc,
            batch_id=batch_id,
            batch_index=batch_index,
            turn_id=turn_id,
            extras=extras,
        )
        if not turn.new_session:
            self.expire_overdue(session_id=turn.session_id)
        return turn

    def check_quota(self, org_id: str) -> None:
        """Refuse a new turn (or batch) of an organisation whose turns used its tokens for today.

        Raises:
            Limited: ``quota_exceeded`` (:meth:`~api_gateway.services.limits.OrgLimitsService.check_quota`).
        """
        if self._limits is not None:
            self._limits.check_quota(org_id)

    @property
    def records(self) -> TurnRepository:
        """The turn repository, for the reads a batch makes of earlier turns."""
        return self._turns

    def deadline(self) -> datetime:
        """The reconciler deadline of a turn accepted or resumed now."""
        return self._clock() + timedelta(seconds=self._settings.reconciler_deadline_seconds)

    def require(self, turn_id: str, *, org_id: str) -> TurnRecord:
        """The caller's turn as it stands.

        Raises:
            NotFound: no turn ``turn_id`` belongs to ``org_id``.
        """
        row = self._turns.get(turn_id, org_id=org_id) if is_turn_id(turn_id) else None
        if row is None:
            raise NotFound("not_found", f"turn {turn_id!r} does not exist")
        return row

    def get(self, turn_id: str, *, org_id: str) -> TurnRecord:
        """The caller's turn, failed first if it waited for client tools past the timeout.

        Raises:
            NotFound: no turn ``turn_id`` belongs to ``org_id``.
        """
        row = self.require(turn_id, org_id=org_id)
        if TurnStatus(row.status) is TurnStatus.REQUIRES_CLIENT_TOOLS and self.expire_overdue(turn_id=turn_id):
            row = self.require(turn_id, org_id=org_id)
        return row

    async def wait(self, row: TurnRecord, *, org_id: str, seconds: float) -> TurnRecord:
        """Long-poll: the turn once it leaves queued/running, or as it stands after ``seconds``.

        Args:
            row: the turn as last read (returned at once when it is not queued or running).
            org_id: the caller's organisation.
            seconds: how long to wait at most.

        Raises:
            NotFound: the turn is gone.
        """
        deadline = time.monotonic() + seconds
        delay = 0.02
        while _in_flight(row) and time.monotonic() < deadline:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 0.25)
            row = await run_in_threadpool(functools.partial(self.require, row.turn_id, org_id=org_id))
        return row

    def resume(self, turn_id: str, body: ToolResultsRequest, *, org_id: str) -> TurnRecord:
        """Accept client tool results: the paused turn runs again from its next round, on any worker.

        The gateway does not judge the results: a worker checks them against the pending calls
        (a mismatch fails the turn with ``continuation_mismatch``).

        Returns:
            The turn, running.

        Raises:
            NotFound: no turn ``turn_id`` belongs to ``org_id``.
            Conflict: ``turn_not_awaiting_tool_results`` (not paused, timed out, or a concurrent post won).
            Unavailable: the broker or the state store refused; the results were not accepted.
        """
        row = self.require(turn_id, org_id=org_id)
        self.expire_overdue(turn_id=turn_id)
        batch = row.batch_id is not None
        results = [result.model_dump() for result in body.tool_results]
        with self._turns.accepting_tool_results(
            turn_id, results=results, now=self._clock(), deadline_at=self.deadline()
        ) as round_:
            if round_ is not None:
                self.sender.send_reentry(turn_id, round_=round_, batch=batch, org_id=org_id)
        if round_ is None:
            current = self.require(turn_id, org_id=org_id)
            raise Conflict(
                "turn_not_awaiting_tool_results", f"turn {turn_id!r} is {current.status}, not requires_client_tools"
            )
        return self.require(turn_id, org_id=org_id)

    def cancel(self, turn_id: str, *, org_id: str) -> TurnRecord:
        """Cancel a turn that has not finished; its session is free at once (``shared.turn_ending``).

        Returns:
            The turn, cancelled.

        Raises:
            NotFound: no turn ``turn_id`` belongs to ``org_id``.
            Conflict: ``turn_finished``.
        """
        self.require(turn_id, org_id=org_id)
        self.expire_overdue(turn_id=turn_id)
        cancelled = self._ending.end(turn_id, CANCELLED_BY_CLIENT)
        if cancelled is None:
            current = self.require(turn_id, org_id=org_id)
            raise Conflict("turn_finished", f"turn {turn_id!r} already finished ({current.status})")
        return cancelled

    def cancel_queued(self, turn_ids: list[str], *, org_id: str) -> list[TurnRecord]:
        """Cancel those of ``turn_ids`` (the caller's, checked) not started yet, at once: a batch's cancel.

        The held ones are withdrawn from admission first, so that none is released while they are
        cancelled; then one bulk update (a turn that started meanwhile is left alone) and what
        :meth:`cancel` does for one turn (``shared.turn_ending``).

        Returns:
            The turns this call cancelled.

        Raises:
            Unavailable: Redis refused the withdrawal; nothing was cancelled.
        """
        self.sender.withdraw(turn_ids, org_id=org_id)
        return self._ending.cancel_queued(turn_ids)

    def trace(self, turn_id: str, *, org_id: str) -> list[TraceStep]:
        """The turn's CompositionTrace: the live one while it runs, else the committed one.

        Raises:
            NotFound: no turn ``turn_id`` belongs to ``org_id``.
        """
        row = self.require(turn_id, org_id=org_id)
        live = self._live_trace(turn_id)
        if live is not None and len(live) >= len(row.trace):
            return live
        return [TraceStep.model_validate(step) for step in row.trace]

    def expire_overdue(self, *, turn_id: str | None = None, session_id: str | None = None) -> int:
        """Fail the turns waiting for client tools past ``APTIX_CLIENT_TOOL_TIMEOUT_SECONDS``.

        Args:
            turn_id: only this turn.
            session_id: only this session's turns (neither: every overdue turn).

        Returns:
            How many turns this call failed.
        """
        timeout = self._settings.client_tool_timeout_seconds
        now = self._clock()
        overdue = self._turns.overdue_waiting(older_than=now - timedelta(seconds=timeout), session_id=session_id)
        if turn_id is not None:
            overdue = [found for found in overdue if found == turn_id]
        error = ErrorInfo(
            code=ErrorCode.CLIENT_TOOL_TIMEOUT,
            message=f"no client tool results arrived within {timeout}s (APTIX_CLIENT_TOOL_TIMEOUT_SECONDS)",
        )
        expired = 0
        for found in overdue:
            if self._ending.end(found, error, only_if=(TurnStatus.REQUIRES_CLIENT_TOOLS,)) is not None:
                expired += 1
                logger.info("turn %s timed out waiting for client tool results", found)
        return expired

    def _live_trace(self, turn_id: str) -> list[TraceStep] | None:
        try:
            state = self._states.load(turn_id)
        except RedisError:
            return None
        return None if state is None else state.trace


def _in_flight(row: TurnRecord) -> bool:
    return TurnStatus(row.status).is_in_flight
