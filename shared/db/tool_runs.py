"""ToolRunRepository: the durable at-most-once record of each server tool call.

``start`` writes "started" before the handler runs and tells the caller whether the call was
started before (by a worker that may have died); ``finish`` writes the outcome once: the first
outcome recorded for a call is the one that stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import ToolRunRow

__all__ = ["ToolRun", "ToolRunRepository", "ToolRunStatus"]

ToolRunStatus = Literal["started", "succeeded", "failed", "unknown"]


@dataclass(frozen=True, slots=True)
class ToolRun:
    """A call's record as found."""

    status: ToolRunStatus
    output: str | None
    worker: str


class ToolRunRepository:
    """Reads and writes of tool runs."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def start(self, *, turn_id: str, call_id: str, name: str, worker: str, now: datetime) -> ToolRun | None:
        """Record that the call starts now.

        Returns:
            None when this call recorded the start (run the tool), else the earlier record.
        """
        with self._db.begin() as orm:
            dialect = postgresql if orm.get_bind().dialect.name == "postgresql" else sqlite
            insert = dialect.insert(ToolRunRow).values(
                turn_id=turn_id, call_id=call_id, name=name, status="started", worker=worker, started_at=now
            )
            inserted = orm.scalar(
                insert.on_conflict_do_nothing(index_elements=["turn_id", "call_id"]).returning(ToolRunRow.turn_id)
            )
            if inserted is not None:
                return None
            row = orm.scalar(select(ToolRunRow).where(ToolRunRow.turn_id == turn_id, ToolRunRow.call_id == call_id))
        assert row is not None
        return _run(row)

    def finish(self, *, turn_id: str, call_id: str, status: ToolRunStatus, output: str, now: datetime) -> bool:
        """Record the call's outcome unless one is recorded already; returns whether this one was."""
        with self._db.begin() as orm:
            result = orm.execute(
                update(ToolRunRow)
                .where(ToolRunRow.turn_id == turn_id, ToolRunRow.call_id == call_id, ToolRunRow.status == "started")
                .values(status=status, output=output, finished_at=now)
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]  # CursorResult has rowcount

    def for_turn(self, turn_id: str) -> dict[str, ToolRun]:
        """Every recorded call of the turn, by call id."""
        with self._db() as orm:
            rows = orm.scalars(select(ToolRunRow).where(ToolRunRow.turn_id == turn_id)).all()
        return {row.call_id: _run(row) for row in rows}


def _run(row: ToolRunRow) -> ToolRun:
    status: ToolRunStatus = row.status  # type: ignore[assignment]  # only ToolRunStatus values are written
    return ToolRun(status=status, output=row.output, worker=row.worker)
