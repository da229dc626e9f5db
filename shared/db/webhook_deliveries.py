"""WebhookDeliveryRepository: webhook deliveries, their attempts, and the endpoints that answered 410.

A delivery is claimed before each attempt with the attempt's number as a fencing token: of several
messages for one attempt (a retry sent with a countdown, the sweep's copy, a broker redelivery) only
the first makes it. The claim also moves ``next_attempt_at`` past the attempt's longest run, so an
attempt whose worker died is swept up again later. (``shared.db.webhook_outbox`` writes deliveries.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, Table, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow
from shared.models.webhook import DeliveryStatus, WebhookAttempt, WebhookDelivery

__all__ = ["Attempt", "Claim", "WebhookDeliveryRepository"]

_DELIVERIES: Table = WebhookDeliveryRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_CLAIM = (
    update(_DELIVERIES)
    .where(
        _DELIVERIES.c.delivery_id == bindparam("p_id"),
        _DELIVERIES.c.status == DeliveryStatus.PENDING.value,
        _DELIVERIES.c.attempts == bindparam("p_attempt", type_=Integer) - 1,
    )
    .values(attempts=_DELIVERIES.c.attempts + 1, next_attempt_at=bindparam("p_lease"), updated_at=bindparam("p_now"))
    .returning(_DELIVERIES.c.org_id, _DELIVERIES.c.url, _DELIVERIES.c.body)
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """An attempt this worker may make: what to send, where, for whom."""

    delivery_id: str
    attempt: int
    """The attempt's number (1 for the first)."""
    org_id: str
    url: str
    body: str
    endpoint_disabled: bool = False
    """The endpoint answered 410 before: the delivery was moved to ``endpoint_disabled``, nothing is sent."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """What one attempt found."""

    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float | None


class WebhookDeliveryRepository:
    """Claims, attempts, the sweep's scan and the API's listing of webhook deliveries."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def claim(self, delivery_id: str, *, attempt: int, now: datetime, lease_until: datetime) -> Claim | None:
        """Take attempt number ``attempt`` of a pending delivery.

        Args:
            delivery_id: the delivery.
            attempt: the attempt the message asks for: claimed only if exactly ``attempt - 1`` were begun.
            now: the time.
            lease_until: when the attempt is presumed lost (its worker died) and is due again.

        Returns:
            The claim; None when the delivery is not pending or that attempt was taken already.
        """
        with self._db.begin() as orm:
            found = orm.execute(
                _CLAIM, {"p_id": delivery_id, "p_attempt": attempt, "p_lease": lease_until, "p_now": now}
            ).one_or_none()
            if found is None:
                return None
            org_id, url, body = found
            disabled = orm.get(WebhookEndpointRow, (org_id, url)) is not None
            if disabled:
                orm.execute(
                    update(_DELIVERIES)
                    .where(_DELIVERIES.c.delivery_id == delivery_id)
                    .values(status=DeliveryStatus.ENDPOINT_DISABLED.value, attempts=attempt - 1,
                            next_attempt_at=None, updated_at=now)
                )  # fmt: skip
        return Claim(
            delivery_id=delivery_id, attempt=attempt, org_id=org_id, url=url, body=body, endpoint_disabled=disabled
        )

    def finish(
        self,
        claim: Claim,
        attempt: Attempt,
        *,
        status: DeliveryStatus,
        next_attempt_at: datetime | None = None,
        disable_reason: str | None = None,
    ) -> None:
        """Record an attempt and where it leaves the delivery, in one transaction.

        Args:
            claim: the claim the attempt was made under.
            attempt: what it found.
            status: the delivery's status now (``pending`` to retry at ``next_attempt_at``).
            next_attempt_at: when the next attempt is due, for ``pending``.
            disable_reason: the endpoint answered 410: disable it, saying why.
        """
        with self._db.begin() as orm:
            orm.add(
                WebhookAttemptRow(
                    delivery_id=claim.delivery_id, attempt=attempt.attempt, at=attempt.at,
                    status_code=attempt.status_code, error=attempt.error, duration_ms=attempt.duration_ms,
                )
            )  # fmt: skip
            orm.execute(
                update(_DELIVERIES)
                .where(
                    _DELIVERIES.c.delivery_id == claim.delivery_id,
                    _DELIVERIES.c.status == DeliveryStatus.PENDING.value,
                    _DELIVERIES.c.attempts == claim.attempt,  # no later attempt was claimed meanwhile
                )
                .values(status=status.value, next_attempt_at=next_attempt_at, updated_at=attempt.at)
            )
            if disable_reason is not None:
                _disable(orm, claim.org_id, claim.url, reason=disable_reason, now=attempt.at)

    def due(self, *, before: datetime, resend_at: datetime, limit: int = 500) -> list[tuple[str, int]]:
        """Pending deliveries due before ``before``, each with the attempt to send; they are not due again
        until ``resend_at`` (if that message is lost too, the sweep sends it once more then).

        Returns:
            (delivery id, attempt number) pairs, the longest overdue first.
        """
        with self._db.begin() as orm:
            rows = orm.execute(
                select(WebhookDeliveryRow.delivery_id, WebhookDeliveryRow.attempts)
                .where(
                    WebhookDeliveryRow.status == DeliveryStatus.PENDING.value,
                    WebhookDeliveryRow.next_attempt_at <= before,
                )
                .order_by(WebhookDeliveryRow.next_attempt_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            if rows:
                orm.execute(
                    update(_DELIVERIES)
                    .where(_DELIVERIES.c.delivery_id.in_([row.delivery_id for row in rows]))
                    .values(next_attempt_at=resend_at)
                )
        return [(row.delivery_id, row.attempts + 1) for row in rows]

    def listing(
        self, *, org_id: str, turn_id: str | None = None, batch_id: str | None = None, limit: int = 100
    ) -> tuple[list[WebhookDelivery], bool]:
        """The organisation's deliveries for a turn, or for a batch (its own event and its turns'), oldest first.

        Returns:
            Up to ``limit`` deliveries with their attempts, and whether more match.
        """
        query = select(WebhookDeliveryRow).where(WebhookDeliveryRow.org_id == org_id)
        if turn_id is not None:
            query = query.where(WebhookDeliveryRow.turn_id == turn_id)
        if batch_id is not None:
            query = query.where(WebhookDeliveryRow.batch_id == batch_id)
        query = query.order_by(WebhookDeliveryRow.created_at, WebhookDeliveryRow.delivery_id).limit(limit + 1)
        with self._db() as orm:
            rows = list(orm.scalars(query))
            more = len(rows) > limit
            rows = rows[:limit]
            attempts: dict[str, list[WebhookAttempt]] = {row.delivery_id: [] for row in rows}
            if rows:
                for found in orm.scalars(
                    select(WebhookAttemptRow)
                    .where(WebhookAttemptRow.delivery_id.in_(list(attempts)))
                    .order_by(WebhookAttemptRow.delivery_id, WebhookAttemptRow.attempt)
                ):
                    attempts[found.delivery_id].append(
                        WebhookAttempt(attempt=found.attempt, at=found.at, status_code=found.status_code,
                                       error=found.error, duration_ms=found.duration_ms)
                    )  # fmt: skip
        return [_delivery(row, attempts[row.delivery_id]) for row in rows], more


def _delivery(row: WebhookDeliveryRow, attempts: list[WebhookAttempt]) -> WebhookDelivery:
    return WebhookDelivery(
        delivery_id=row.delivery_id, event_type=row.event_type, turn_id=row.turn_id, batch_id=row.batch_id,
        url=row.url, status=DeliveryStatus(row.status), created_at=row.created_at,
        next_attempt_at=row.next_attempt_at if row.status == DeliveryStatus.PENDING.value else None,
        attempts=attempts,
    )  # fmt: skip


def _disable(orm: Session, org_id: str, url: str, *, reason: str, now: datetime) -> None:
    name = orm.get_bind().dialect.name
    dialect: Any = postgresql if name == "postgresql" else sqlite
    orm.execute(
        dialect.insert(WebhookEndpointRow.__table__)
        .values(org_id=org_id, url=url, disabled_at=now, reason=reason)
        .on_conflict_do_nothing(index_elements=["org_id", "url"])
    )
