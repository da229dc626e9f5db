"""ApiKeyRepository: the organisations' API keys (``aptix keys``) and the version gateways poll for changes.

Every change to a key (its creation, its revocation) bumps the one-row ``api_key_version`` in the
same transaction and stamps the key's row with the new version. The bump is an ``UPDATE`` of that
row, so writers take its lock in turn and commit in version order: once a gateway reads version
``V``, every change numbered ``V`` or less is committed, and :meth:`ApiKeyRepository.changes_since`
hands it exactly the keys it must forget.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session, sessionmaker

from shared.api_keys import hash_key, key_prefix, new_key, new_key_id
from shared.db.tables import ApiKeyRow, ApiKeyVersionRow

__all__ = ["ApiKeyRecord", "ApiKeyRepository", "KeyChanges"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKeyRecord:
    """An API key as recorded (never the key itself)."""

    key_id: str
    org_id: str
    name: str | None
    prefix: str
    """``aptix_`` and the key's first 8 digits."""
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    version: int
    """The ``api_key_version`` of the key's last change (its creation, its revocation)."""

    def refusal(self, now: datetime) -> str | None:
        """Why the key is refused at ``now`` (``revoked``, ``expired``), or None when it is accepted."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return None


class KeyChanges(NamedTuple):
    """What changed after a version a gateway had seen."""

    version: int
    """The newest version: ask for the changes after this one next time."""
    key_versions: dict[str, int]
    """The keys created or revoked after the version asked about: each one's hash, and the version of its
    last change (a gateway that looked a key up at that version or later already knows of it)."""


class ApiKeyRepository:
    """Reads and writes of ``api_keys`` and ``api_key_version``."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def create(
        self, *, org_id: str, name: str | None, expires_at: datetime | None, now: datetime
    ) -> tuple[ApiKeyRecord, str]:
        """Make a new key of ``org_id`` and store its hash.

        Returns:
            The key's record and the key itself: the only time anyone sees it.
        """
        key = new_key()
        row = ApiKeyRow(
            key_id=new_key_id(), org_id=org_id, name=name, prefix=key_prefix(key), key_hash=hash_key(key),
            created_at=now, expires_at=expires_at, revoked_at=None, last_used_at=None,
        )  # fmt: skip
        with self._db.begin() as orm:
            row.version = _bump(orm)
            orm.add(row)
        return _record(row), key

    def find_all(self, *, org_id: str | None = None) -> list[ApiKeyRecord]:
        """Every key (of ``org_id`` when given), oldest first, revoked and expired ones too."""
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.key_id)
        if org_id is not None:
            query = query.where(ApiKeyRow.org_id == org_id)
        with self._db() as orm:
            return [_record(row) for row in orm.scalars(query)]

    def revoke(self, key_id: str, *, now: datetime) -> ApiKeyRecord | None:
        """Revoke the key ``key_id`` from ``now`` on; a key revoked already keeps its first revocation.

        Returns:
            The key's record, or None when no key has that id.
        """
        with self._db.begin() as orm:
            row = orm.get(ApiKeyRow, key_id, with_for_update=True)
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = now
                row.version = _bump(orm)
            return _record(row)

    def verify(self, key_hash: str, *, now: datetime, touch_before: datetime) -> ApiKeyRecord | None:
        """Look a presented key up by its hash, and note its use.

        Writes ``last_used_at = now`` when the key is accepted and its last use is before
        ``touch_before`` (so a key is written at most once per verification interval).

        Returns:
            The key's record (it may be revoked or expired: :meth:`ApiKeyRecord.refusal`), or None
            when no key has that hash.
        """
        with self._db.begin() as orm:
            row = orm.scalars(select(ApiKeyRow).where(ApiKeyRow.key_hash == key_hash)).one_or_none()
            if row is None:
                return None
            record = _record(row)
            if record.refusal(now) is None and (row.last_used_at is None or row.last_used_at < touch_before):
                row.last_used_at = now
        return record

    def changes_since(self, version: int) -> KeyChanges:
        """The newest version, and the keys created or revoked after ``version`` (hash: version of the change)."""
        with self._db() as orm:
            newest = orm.scalar(select(ApiKeyVersionRow.version).where(ApiKeyVersionRow.singleton == 1)) or 0
            if newest <= version:
                return KeyChanges(newest, {})
            changed = orm.execute(
                select(ApiKeyRow.key_hash, ApiKeyRow.version).where(
                    ApiKeyRow.version > version, ApiKeyRow.version <= newest
                )
            )
            return KeyChanges(newest, {key_hash: int(changed_at) for key_hash, changed_at in changed})

    def any_accepted(self, now: datetime) -> bool:
        """Whether some key is neither revoked nor expired at ``now``."""
        usable = select(ApiKeyRow.key_id).where(
            ApiKeyRow.revoked_at.is_(None), (ApiKeyRow.expires_at.is_(None)) | (ApiKeyRow.expires_at > now)
        )
        with self._db() as orm:
            return bool(orm.scalar(select(exists(usable))))

    def org_ids(self) -> list[str]:
        """The organisations some key names (an organisation exists once a key names it), sorted."""
        with self._db() as orm:
            return list(orm.scalars(select(ApiKeyRow.org_id).distinct().order_by(ApiKeyRow.org_id)))


def _bump(orm: Session) -> int:
    """Bump ``api_key_version`` in ``orm``'s transaction (taking its row lock until commit); the new version."""
    version = orm.scalar(
        update(ApiKeyVersionRow)
        .where(ApiKeyVersionRow.singleton == 1)
        .values(version=ApiKeyVersionRow.version + 1)
        .returning(ApiKeyVersionRow.version)
    )
    if version is None:  # a schema made by create_all (unit tests); the migration inserts the row
        orm.add(ApiKeyVersionRow(singleton=1, version=1))
        version = 1
    return int(version)


def _record(row: ApiKeyRow) -> ApiKeyRecord:
    return ApiKeyRecord(**{field.name: getattr(row, field.name) for field in fields(ApiKeyRecord)})
