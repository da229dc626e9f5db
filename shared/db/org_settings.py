"""OrgSettingsRepository: each organisation's own limits (``aptix orgs set``), in ``org_settings``.

A limit left None is the default: ``APTIX_ORG_MAX_IN_FLIGHT`` for the admission cap, no limit for the
requests per minute and the daily tokens. The table is small (one row per organisation that has a
limit of its own): readers load all of it at once (:meth:`OrgSettingsRepository.all`) and cache it
(``shared.ttl_cache``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import OrgSettingsRow

__all__ = ["UNCHANGED", "OrgLimits", "OrgSettingsRepository", "Unchanged"]


class Unchanged:
    """The value of a limit :meth:`OrgSettingsRepository.set` leaves as it is."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


@dataclass(frozen=True, slots=True)
class OrgLimits:
    """An organisation's own limits; None: the default (``max_in_flight``) or no limit (the others)."""

    org_id: str
    max_in_flight: int | None = None
    rpm: int | None = None
    tokens_per_day: int | None = None
    updated_at: datetime | None = None
    """When they were last set (None: never)."""


class OrgSettingsRepository:
    """Reads and writes of ``org_settings``."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def all(self) -> dict[str, OrgLimits]:
        """Every organisation that has a limit of its own, by id (one query)."""
        with self._db() as orm:
            return {row.org_id: _limits(row) for row in orm.scalars(select(OrgSettingsRow))}

    def get(self, org_id: str) -> OrgLimits:
        """The organisation's limits (all None when it never had any)."""
        with self._db() as orm:
            row = orm.get(OrgSettingsRow, org_id)
        return OrgLimits(org_id) if row is None else _limits(row)

    def set(
        self,
        org_id: str,
        *,
        now: datetime,
        max_in_flight: int | Unchanged | None = UNCHANGED,
        rpm: int | Unchanged | None = UNCHANGED,
        tokens_per_day: int | Unchanged | None = UNCHANGED,
    ) -> OrgLimits:
        """Set some of the organisation's limits (None: back to the default); the others stay.

        Reads and writes the organisation's row in one transaction (locked while it is written).

        Returns:
            The limits as they now stand.
        """
        with self._db.begin() as orm:
            row = orm.get(OrgSettingsRow, org_id, with_for_update=True)
            if row is None:
                row = OrgSettingsRow(org_id=org_id, updated_at=now)
                orm.add(row)
            for name, value in (("max_in_flight", max_in_flight), ("rpm", rpm), ("tokens_per_day", tokens_per_day)):
                if not isinstance(value, Unchanged):
                    setattr(row, name, value)
            row.updated_at = now
            orm.flush()
            return _limits(row)


def _limits(row: OrgSettingsRow) -> OrgLimits:
    return OrgLimits(row.org_id, row.max_in_flight, row.rpm, row.tokens_per_day, row.updated_at)
