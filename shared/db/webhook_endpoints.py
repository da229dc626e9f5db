"""WebhookEndpointRepository: the endpoints an organisation's events go to, and whether each is disabled.

An endpoint that answered 410 Gone is disabled (a ``webhook_endpoints`` row, written by
``shared.db.webhook_deliveries``): its later events are recorded ``endpoint_disabled`` and not sent.
:meth:`WebhookEndpointRepository.enable` (``aptix webhooks enable``) deletes that row: events recorded
from then on are sent again (those recorded while it was disabled are not). The endpoints listed
(``GET /v1/webhook-endpoints``) are the URLs the organisation's deliveries named, the disabled ones and
its default (``APTIX_WEBHOOK_DEFAULT_URLS``), each once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import WebhookDeliveryRow, WebhookEndpointRow

__all__ = ["EndpointRecord", "WebhookEndpointRepository"]


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """One endpoint of an organisation as it stands."""

    url: str
    disabled_at: datetime | None
    """When it answered 410 Gone (None: enabled)."""
    reason: str | None
    deliveries: int
    """Deliveries recorded for it (any status)."""
    last_event_at: datetime | None
    """When the newest of them was recorded."""


class WebhookEndpointRepository:
    """Reads of an organisation's endpoints, and their re-enabling."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def listing(self, org_id: str, *, also: tuple[str, ...] = ()) -> list[EndpointRecord]:
        """The organisation's endpoints (those its deliveries named, the disabled ones, and ``also``), by URL.

        Reads ``webhook_deliveries`` (grouped by URL: ``ix_webhook_deliveries_org_url``) and ``webhook_endpoints``.
        """
        used = (
            select(WebhookDeliveryRow.url, func.count(), func.max(WebhookDeliveryRow.created_at))
            .where(WebhookDeliveryRow.org_id == org_id)
            .group_by(WebhookDeliveryRow.url)
        )
        with self._db() as orm:
            counts = {url: (int(n), last) for url, n, last in orm.execute(used).all()}
            disabled = {
                row.url: row
                for row in orm.scalars(select(WebhookEndpointRow).where(WebhookEndpointRow.org_id == org_id))
            }
        urls = sorted(set(counts) | set(disabled) | set(also))
        return [
            EndpointRecord(
                url=url,
                disabled_at=disabled[url].disabled_at if url in disabled else None,
                reason=disabled[url].reason if url in disabled else None,
                deliveries=counts.get(url, (0, None))[0],
                last_event_at=counts.get(url, (0, None))[1],
            )
            for url in urls
        ]

    def enable(self, org_id: str, url: str) -> bool:
        """Enable a disabled endpoint again; whether it was disabled."""
        with self._db.begin() as orm:
            result = orm.execute(
                delete(WebhookEndpointRow).where(WebhookEndpointRow.org_id == org_id, WebhookEndpointRow.url == url)
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount
