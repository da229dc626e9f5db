"""WebhookSecretRepository: the webhook signing secrets kept in the database (``aptix webhooks secret``).

An organisation may hold several active secrets: each signs every delivery (``workers.webhooks.signing``),
so rotating is *add* the new one, move the receiver to it, *retire* the old one, with no delivery that
the receiver cannot verify. The secrets are stored as given (``whsec_<base64>``): they sign, so they
cannot be kept as hashes; the database is as secret as ``APTIX_WEBHOOK_SECRETS`` is. Signers read
every organisation's active secrets at once (:meth:`WebhookSecretRepository.active`) through a short
cache (:func:`stored_secrets`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import WebhookSecretRow
from shared.ttl_cache import Cached
from shared.webhooks.parsing import parse_secrets

__all__ = ["SecretRecord", "WebhookSecretRepository", "new_secret_id", "stored_secrets"]


@dataclass(frozen=True, slots=True)
class SecretRecord:
    """A stored secret as ``aptix webhooks secret list`` shows it: never the secret itself, but its start."""

    secret_id: str
    org_id: str
    hint: str
    """The secret's first characters (``whsec_AbCd…``), to tell it from others."""
    created_at: datetime
    retired_at: datetime | None


def new_secret_id() -> str:
    """A fresh secret id: ``whs_`` and 16 hex digits."""
    return "whs_" + secrets.token_hex(8)


class WebhookSecretRepository:
    """Reads and writes of ``webhook_secrets``."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def add(self, org_id: str, secret: str, *, now: datetime) -> SecretRecord:
        """Store an active secret of ``org_id`` (``whsec_<base64>``, checked as ``APTIX_WEBHOOK_SECRETS`` checks one).

        Raises:
            ValueError: the secret is not ``whsec_`` and the base64 of at least 16 bytes.
        """
        parse_secrets(f"{org_id}:{secret}")
        row = WebhookSecretRow(secret_id=new_secret_id(), org_id=org_id, secret=secret, created_at=now)
        with self._db.begin() as orm:
            orm.add(row)
        return _record(row)

    def listing(self, org_id: str | None = None) -> list[SecretRecord]:
        """The stored secrets (of ``org_id``, else of every organisation), retired ones included, oldest first."""
        query = select(WebhookSecretRow).order_by(WebhookSecretRow.org_id, WebhookSecretRow.created_at)
        if org_id is not None:
            query = query.where(WebhookSecretRow.org_id == org_id)
        with self._db() as orm:
            return [_record(row) for row in orm.scalars(query)]

    def retire(self, secret_id: str, *, now: datetime) -> SecretRecord | None:
        """Stop a secret signing (once: a retired secret keeps its first ``retired_at``); None when unknown."""
        with self._db.begin() as orm:
            row = orm.get(WebhookSecretRow, secret_id, with_for_update=True)
            if row is None:
                return None
            if row.retired_at is None:
                row.retired_at = now
            return _record(row)

    def active(self) -> dict[str, list[bytes]]:
        """Every organisation's active signing keys (decoded from ``whsec_…``), oldest first (one query)."""
        query = (
            select(WebhookSecretRow.org_id, WebhookSecretRow.secret)
            .where(WebhookSecretRow.retired_at.is_(None))
            .order_by(WebhookSecretRow.created_at)
        )
        keys: dict[str, list[bytes]] = {}
        with self._db() as orm:
            for org_id, secret in orm.execute(query).all():
                keys.setdefault(org_id, []).append(parse_secrets(f"{org_id}:{secret}")[org_id])
        return keys


def stored_secrets(db: sessionmaker[Session]) -> Cached[Mapping[str, Sequence[bytes]]]:
    """The active stored secrets, read at most every ``shared.ttl_cache.REFRESH_SECONDS`` (the last ones known
    while the database does not answer): ``WebhookConfig.stored`` of a gateway or a worker."""
    active: Callable[[], Mapping[str, Sequence[bytes]]] = WebhookSecretRepository(db).active
    return Cached(active, what="the webhook secrets (webhook_secrets)")


def _record(row: WebhookSecretRow) -> SecretRecord:
    return SecretRecord(row.secret_id, row.org_id, row.secret[:10] + "…", row.created_at, row.retired_at)
