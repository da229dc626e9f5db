"""UsageRepository: an organisation's turns and tokens per UTC day, summed from the turns table.

A turn counts on the UTC day it was created, with its ``usage`` as last committed (every model call
of every round so far: the worker adds each call's usage to the turn's as the model reports it).
``GET /v1/usage`` reads :meth:`UsageRepository.daily`; the daily token budget's Redis count
(``shared.state.token_usage``) is seeded from :meth:`UsageRepository.tokens_by_turn` when Redis has none.
Both use ``ix_turns_org_created``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import ColumnElement, Integer, cast, func, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import TurnRow

__all__ = ["DayUsage", "UsageRepository", "day_bounds"]


@dataclass(frozen=True, slots=True)
class DayUsage:
    """One UTC day of an organisation's turns."""

    day: date
    turns: int = 0
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input and output tokens: what the daily budget counts."""
        return self.input_tokens + self.output_tokens


def day_bounds(first: date, last: date) -> tuple[datetime, datetime]:
    """The UTC instants from the start of ``first`` to the end of ``last`` (exclusive)."""
    return datetime.combine(first, time(), UTC), datetime.combine(last + timedelta(days=1), time(), UTC)


def _usage_int(name: str) -> ColumnElement[int]:
    return func.coalesce(cast(TurnRow.usage[name].as_integer(), Integer), 0)


class UsageRepository:
    """Sums of the turns' usage; reads only."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def daily(self, org_id: str, *, first: date, last: date) -> list[DayUsage]:
        """Every day from ``first`` to ``last`` (inclusive), oldest first, a day without turns with zeros.

        Reads ``turns`` (one grouped query on the organisation's turns created in the range).
        """
        start, end = day_bounds(first, last)
        with self._db() as orm:
            day = _day(orm)
            query = (
                select(
                    day,
                    func.count(),
                    func.sum(_usage_int("llm_calls")),
                    func.sum(_usage_int("input_tokens")),
                    func.sum(_usage_int("output_tokens")),
                )
                .where(TurnRow.org_id == org_id, TurnRow.created_at >= start, TurnRow.created_at < end)
                .group_by(day)
            )
            found = {
                date.fromisoformat(str(row[0])[:10]): DayUsage(
                    date.fromisoformat(str(row[0])[:10]), int(row[1]), int(row[2] or 0), int(row[3] or 0),
                    int(row[4] or 0),
                )
                for row in orm.execute(query).all()
            }  # fmt: skip
        days = (last - first).days + 1
        return [found.get(first + timedelta(days=n), DayUsage(first + timedelta(days=n))) for n in range(days)]

    def tokens_by_turn(self, org_id: str, day: date) -> dict[str, int]:
        """The tokens (input + output) of each of the organisation's turns created on ``day`` that used any."""
        start, end = day_bounds(day, day)
        tokens = _usage_int("input_tokens") + _usage_int("output_tokens")
        query = select(TurnRow.turn_id, tokens).where(
            TurnRow.org_id == org_id, TurnRow.created_at >= start, TurnRow.created_at < end
        )
        with self._db() as orm:
            return {turn_id: int(used) for turn_id, used in orm.execute(query).all() if used}


def _day(orm: Session) -> ColumnElement[str]:
    """The UTC day of ``created_at`` as ``YYYY-MM-DD``, in the dialect of ``orm``'s database."""
    if orm.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", TurnRow.created_at), "YYYY-MM-DD")
    return func.strftime("%Y-%m-%d", TurnRow.created_at)
