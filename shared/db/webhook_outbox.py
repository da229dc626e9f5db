"""WebhookOutbox: a webhook event is written in the transaction of what raised it; someone else sends it.

A turn's commit (the ``persist`` step), its end outside the pipeline (a cancel, a client-tool
timeout, a failure the reconciler or the driver writes) and a batch's last turn each record their
event as a ``webhook_deliveries`` row inside their own database transaction, so an event exists if
and only if what it reports was committed. The repository returns the ids of the deliveries it
recorded (``shared.db.records.Committed``, ``Ended``) and sends nothing: once the transaction has
committed, the caller hands them to the webhooks queue through a ``shared.webhooks.WebhookSender``
(the driver after ``persist``, ``shared.turn_ending`` after an early end), best effort: if the
process dies first or the broker refuses, the row stays pending and the reconciler's sweep sends it.
A committed delivery is never lost, and a webhook never fails nor delays the turn: an error
recording the event is logged and the turn commits without it.

Each event has a key (``turn:<id>:<round>:<status>``, ``batch:<id>``) written at most once, so a
commit that runs twice (a redelivered ``persist``) raises its event once.

A turn created through the OpenAI face (``TurnExtras.face``) raises OpenAI's event for its round
(``response.completed`` / ``failed`` / ``cancelled``: ``shared.webhooks.events``), in the same rows,
under the same keys, signed the same way; every other turn raises ours. A batch of the OpenAI face
(an ``openai_batches`` row) raises OpenAI's ``batch.completed`` / ``cancelled`` / ``expired`` instead of
ours, once its output and error files are written (and ``batch.failed`` when its file fails validation:
:meth:`WebhookOutbox.record_openai_batch`, called by ``OpenAIBatchRepository``); its requests raise no
event of their own, as OpenAI's do not.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from shared.db.records import TurnRecord
from shared.db.tables import BatchRow, OpenAIBatchRow, TurnRow, WebhookDeliveryRow
from shared.db.turn_sql import IN_FLIGHT, to_record
from shared.models.batch import Batch, BatchStatus
from shared.models.turn import TurnStatus
from shared.openai import FACE_OPENAI, TurnExtras, response_id
from shared.turn_view import to_turn
from shared.webhooks.config import WebhookConfig
from shared.webhooks.events import (
    EventType,
    event_body,
    new_delivery_id,
    object_event_body,
    response_event_body,
    turn_event_type,
)

__all__ = ["PENDING", "WebhookOutbox"]

logger = logging.getLogger(__name__)

PENDING = "pending"
"""The status of a delivery still to attempt."""

_DELIVERIES: Table = WebhookDeliveryRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_INSERT: dict[str, Insert] = {}


class WebhookOutbox:
    """Records webhook events in the caller's transaction (sending them is the caller's next step)."""

    def __init__(self, config: WebhookConfig) -> None:
        """Build the outbox on ``config``: which organisations get webhooks, and where."""
        self._config = config

    def prepare(self) -> None:
        """Read the organisations' stored secrets now if they are due (``WebhookConfig.stored``), before the
        caller opens the transaction the outbox writes in: a read inside it would hold one connection while
        it waits for another."""
        if self._config.stored is not None:
            self._config.stored.get()

    def applies_to(self, org_id: str) -> bool:
        """Whether events of ``org_id`` may be recorded at all (it has a secret): else nothing to do."""
        return bool(self._config.keys_for(org_id))

    def record_turn(self, orm: Session, row: TurnRow, *, now: datetime) -> list[str]:
        """Record the event of ``row``'s new status (and its batch's, if this turn was its last in flight).

        Runs inside the transaction that wrote the status; an error other than a lost connection is
        logged and swallowed (a savepoint keeps the caller's writes), so the turn commits regardless.

        Args:
            orm: the caller's session, its transaction open, ``row``'s change flushed.
            row: the turn as just written.
            now: the event's time.

        Returns:
            The ids of the deliveries recorded now (none when the event was recorded before).
        """
        if not self.applies_to(row.org_id):
            return []
        try:
            with orm.begin_nested():
                return self._record_turn(orm, row, now=now)
        except (OperationalError, InterfaceError):
            raise  # the connection itself: the caller's commit fails too, and is retried as a whole
        except Exception:  # a webhook never fails the turn (module docstring)
            logger.exception("could not record the webhook event of turn %s; the turn commits without it", row.turn_id)
            return []

    def record_turns(self, orm: Session, rows: Sequence[TurnRow], *, now: datetime) -> list[str]:
        """:meth:`record_turn` for many turns ended at once (a batch's cancel): each turn's event, then
        each of their batches' once.

        Args:
            orm: the caller's session, its transaction open, the rows' changes written.
            rows: the turns as just written.
            now: the events' time.

        Returns:
            The ids of the deliveries recorded now.
        """
        recorded: list[str] = []
        batches: dict[str, str] = {}
        for row in rows:
            if not self.applies_to(row.org_id):
                continue
            try:
                with orm.begin_nested():
                    recorded += self._record_turn(orm, row, now=now, with_batch=False)
            except (OperationalError, InterfaceError):
                raise
            except Exception:  # a webhook never fails the turn (module docstring)
                logger.exception("could not record the webhook event of turn %s", row.turn_id)
            if row.batch_id is not None:
                batches[row.batch_id] = row.org_id
        for batch_id, org_id in batches.items():
            try:
                with orm.begin_nested():
                    recorded += self._record_batch(orm, batch_id, org_id=org_id, now=now)
            except (OperationalError, InterfaceError):
                raise
            except Exception:  # as above
                logger.exception("could not record the webhook event of batch %s", batch_id)
        return recorded

    def _record_turn(self, orm: Session, row: TurnRow, *, now: datetime, with_batch: bool = True) -> list[str]:
        record = to_record(row)
        recorded = []
        extras = TurnExtras.of(record.request)
        face = extras.face
        # A request of an OpenAI batch raises no event of its own (its batch does): OpenAI's raise none.
        event = None if extras.custom_id is not None else turn_event_type(record.status, face=face)
        requested = record.request.get("webhook_url")
        url = self._config.url_for(record.org_id, requested if isinstance(requested, str) else None)
        if event is not None and url is not None:
            delivery_id = new_delivery_id(face=face)
            key = f"turn:{record.turn_id}:{record.round}:{record.status.value}"
            body = _turn_event_body(record, delivery_id, event, face=face, now=now)
            recorded += _insert(orm, key, delivery_id, event, body, org_id=record.org_id, url=url, now=now,
                                turn_id=record.turn_id, batch_id=record.batch_id)  # fmt: skip
        if with_batch and record.batch_id is not None and not record.status.is_in_flight:
            recorded += self._record_batch(orm, record.batch_id, org_id=record.org_id, now=now)
        return recorded

    def _record_batch(self, orm: Session, batch_id: str, *, org_id: str, now: datetime) -> list[str]:
        """``batch.completed`` when none of the batch's turns is in flight any more.

        The batch row is locked first: two last turns committing at once take turns here, and the
        second sees the first's status, so exactly one of them raises the event.
        """
        batch = orm.scalars(select(BatchRow).where(BatchRow.batch_id == batch_id).with_for_update()).one_or_none()
        url = None if batch is None else self._config.url_for(org_id, batch.webhook_url)
        if batch is None or url is None:
            return []
        moving = orm.scalar(
            select(TurnRow.turn_id).where(TurnRow.batch_id == batch_id, TurnRow.status.in_(IN_FLIGHT)).limit(1)
        )
        if moving is not None:
            return []
        if orm.get(OpenAIBatchRow, batch_id) is not None:
            return []  # its event goes with its output and error files, once written (OpenAIBatchRepository.finish)
        counts = dict.fromkeys(TurnStatus, 0)
        for status, count in orm.execute(
            select(TurnRow.status, func.count()).where(TurnRow.batch_id == batch_id).group_by(TurnRow.status)
        ).all():
            counts[TurnStatus(status)] = int(count)
        data = Batch(
            batch_id=batch_id,
            status=BatchStatus.COMPLETED if batch.cancel_requested_at is None else BatchStatus.CANCELLED,
            total=batch.total,
            reused=batch.reused,
            counts=counts,
            created_at=batch.created_at,
            cancel_requested_at=batch.cancel_requested_at,
        )
        delivery_id = new_delivery_id()
        body = event_body(delivery_id, EventType.BATCH_COMPLETED, data.model_dump(mode="json"), at=now)
        return _insert(orm, f"batch:{batch_id}", delivery_id, EventType.BATCH_COMPLETED, body,
                       org_id=org_id, url=url, now=now, turn_id=None, batch_id=batch_id)  # fmt: skip

    def record_openai_batch(
        self, orm: Session, batch_id: str, *, event: str, org_id: str, webhook_url: str | None, now: datetime
    ) -> list[str]:
        """Record a batch event of the OpenAI face (``batch.completed``, ``failed``, ``cancelled``, ``expired``),
        once per batch, in the caller's transaction.

        Returns:
            The id of the delivery recorded now, if any.
        """
        url = self._config.url_for(org_id, webhook_url) if self.applies_to(org_id) else None
        if url is None:
            return []
        delivery_id = new_delivery_id(face=FACE_OPENAI)
        kind = EventType(event)
        body = object_event_body(delivery_id, kind, object_id=batch_id, at=now)
        return _insert(orm, f"batch:{batch_id}", delivery_id, kind, body, org_id=org_id, url=url, now=now,
                       turn_id=None, batch_id=batch_id)  # fmt: skip


def _turn_event_body(record: TurnRecord, delivery_id: str, event: EventType, *, face: str | None, now: datetime) -> str:
    """A turn's event: the response that is its round (OpenAI face), else the Turn as the API shows it."""
    if face == FACE_OPENAI:
        return response_event_body(delivery_id, event, response_id=response_id(record.turn_id, record.round), at=now)
    return event_body(delivery_id, event, to_turn(record).model_dump(mode="json", by_alias=True), at=now)


def _insert(
    orm: Session,
    key: str,
    delivery_id: str,
    event: EventType,
    body: str,
    *,
    org_id: str,
    url: str,
    now: datetime,
    turn_id: str | None,
    batch_id: str | None,
) -> list[str]:
    """Insert the event's delivery unless its key is recorded; the new delivery's id, if any."""
    values = {
        "delivery_id": delivery_id, "event_key": key, "org_id": org_id, "event_type": event.value,
        "turn_id": turn_id, "batch_id": batch_id, "url": url, "body": body,
        "status": PENDING, "attempts": 0, "next_attempt_at": now, "created_at": now, "updated_at": now,
    }  # fmt: skip
    return list(orm.scalars(_insert_statement(orm), values))


def _insert_statement(orm: Session) -> Insert:
    name = orm.get_bind().dialect.name
    statement = _INSERT.get(name)
    if statement is None:
        dialect = postgresql if name == "postgresql" else sqlite
        statement = _INSERT[name] = (
            dialect.insert(_DELIVERIES)
            .on_conflict_do_nothing(index_elements=["event_key"])
            .returning(_DELIVERIES.c.delivery_id)
        )
    return statement
