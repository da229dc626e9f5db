"""Admission: checking a TurnRequest against the catalog and the caller's sessions, and enqueueing.

Shared by single turns and batches, so both refuse the same inputs the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

from kombu.exceptions import OperationalError as BrokerError
from redis import RedisError

from api_gateway.errors import ApiError
from api_gateway.expiry import expire_overdue
from api_gateway.ids import is_session_id, new_session_id, new_turn_id
from api_gateway.state import GatewayState
from shared.broker import BATCH_PRIORITY, BATCH_START_PRIORITY, INTERACTIVE_PRIORITY, send_step
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnRequest
from shared.db.turns import NewTurn
from shared.task_names import StepName

__all__ = ["BrokerUnavailable", "admit", "enqueue_reentry", "enqueue_turns"]

logger = logging.getLogger(__name__)

BROKER_ERRORS = (BrokerError, RedisError, OSError)


class BrokerUnavailable(Exception):
    """The broker refused a message."""


def admit(
    gateway: GatewayState,
    body: TurnRequest,
    *,
    org_id: str,
    user_id: str,
    loc: tuple[str | int, ...] = ("body",),
    batch_id: str | None = None,
    batch_index: int | None = None,
) -> NewTurn:
    """Check ``body`` and describe the turn to record.

    Raises:
        ApiError: 422 for a client tool named like a server tool or an unknown mode on a new
            session; 404 ``session_not_found`` for a session the caller cannot see.
    """
    clashes = sorted(gateway.catalog.server_tool_names.intersection(tool.name for tool in body.tools))
    if clashes:
        raise ApiError(
            422,
            "invalid_request",
            f"client tools may not take the name of a server tool: {', '.join(clashes)}",
            [{"loc": [*loc, "tools"], "msg": "name taken by a server tool", "type": "value_error"}],
        )
    new_session = body.session_id is None
    if new_session:
        if body.mode is not None and gateway.catalog.get(body.mode) is None:
            raise ApiError(
                422,
                "invalid_request",
                f"unknown mode {body.mode!r}; the catalog has: {', '.join(gateway.catalog.mode_names)}",
                [{"loc": [*loc, "mode"], "msg": "unknown mode", "type": "value_error"}],
            )
        session_id = new_session_id()
    else:
        assert body.session_id is not None
        session_id = body.session_id
        if not is_session_id(session_id) or gateway.sessions.get(session_id, org_id=org_id) is None:
            raise ApiError(404, "session_not_found", f"session {session_id!r} does not exist")
        expire_overdue(gateway, session_id=session_id)
    request = body.model_dump(mode="json", exclude={"idempotency_key"})
    return NewTurn(
        turn_id=new_turn_id(),
        session_id=session_id,
        org_id=org_id,
        user_id=user_id,
        new_session=new_session,
        requested_mode=body.mode,
        request=request,
        request_hash=hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest(),
        idempotency_key=body.idempotency_key,
        batch_id=batch_id,
        batch_index=batch_index,
    )


def enqueue_turns(gateway: GatewayState, turn_ids: list[str], *, batch: bool = False) -> None:
    """Send each turn's first step, and mark the turns in flight for the reconciler.

    A first message may wait in the broker behind a backlog: the marker says so for
    ``APTIX_RECONCILER_QUEUED_SECONDS``, so the reconciler does not send it twice meanwhile (a broker
    that loses its messages loses the markers with them, or the reconciler notices and drops them).

    Raises:
        BrokerUnavailable: the broker or the state store refused (the caller's transaction then rolls back).
    """
    priority = BATCH_START_PRIORITY if batch else INTERACTIVE_PRIORITY
    try:
        _mark_queued(gateway, turn_ids)
        with gateway.producer.producer_or_acquire() as producer:
            for turn_id in turn_ids:
                envelope = TurnEnvelope(turn_id=turn_id, step=StepName.REQUEST_HANDLER, priority=priority)
                send_step(gateway.producer, envelope, producer=producer)
    except BROKER_ERRORS as exc:
        logger.error("could not enqueue %d turn(s): %s", len(turn_ids), exc)
        raise BrokerUnavailable(str(exc)) from exc
    gateway.metrics.turns_accepted.labels("batch" if batch else "single").inc(len(turn_ids))


def enqueue_reentry(gateway: GatewayState, turn_id: str, *, round_: int, batch: bool) -> None:
    """Send the first step of a tool-results re-entry.

    Raises:
        BrokerUnavailable: the broker refused the message.
    """
    priority = BATCH_PRIORITY if batch else INTERACTIVE_PRIORITY
    envelope = TurnEnvelope(turn_id=turn_id, step=StepName.REQUEST_HANDLER, round=round_, priority=priority)
    try:
        # A re-entry is a running turn: its marker covers the usual deadline, not a batch backlog.
        gateway.store.mark_alive([turn_id], until=time.time() + gateway.settings.reconciler_deadline_seconds)
        send_step(gateway.producer, envelope)
    except BROKER_ERRORS as exc:
        logger.error("could not enqueue the re-entry of turn %s: %s", turn_id, exc)
        raise BrokerUnavailable(str(exc)) from exc


def _mark_queued(gateway: GatewayState, turn_ids: list[str]) -> None:
    until = time.time() + gateway.settings.reconciler_queued_seconds
    gateway.store.mark_alive(turn_ids, until=until)
