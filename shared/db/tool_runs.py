"""ToolRunRepository: the durable at-most-once record of each server tool call.

``start`` writes "started" before the handler runs and tells the caller whether the call was
started before (by a worker that may have died); ``finish`` writes the outcome once: the first
outcome recorded for a call is the one that stands.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Row, Table, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from shared.db.engine import one_statement
from shared.db.tables import ToolRunRow

__all__ = ["ToolRun", "ToolRunRepository", "ToolRunStatus"]

ToolRunStatus = Literal["started", "succeeded", "failed", "unknown"]
_TOOL_RUNS: Table = ToolRunRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table


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
        """Record that the call starts now (one round trip on PostgreSQL: ``one_statement``; a second to read
        the earlier record when there is one).

        Returns:
            None when this call recorded the start (run the tool), else the earlier record.
        """
        with one_statement(self._db) as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            insert = dialect.insert(_TOOL_RUNS).values(
                turn_id=turn_id, call_id=call_id, name=name, status="started", worker=worker, started_at=now
            )
            inserted = conn.scalar(
                insert.on_conflict_do_nothing(index_elements=["turn_id", "call_id"]).returning(_TOOL_RUNS.c.turn_id)
            )
            if inserted is not None:
                return None
            row = conn.execute(
                select(_TOOL_RUNS).where(_TOOL_RUNS.c.turn_id == turn_id, _TOOL_RUNS.c.call_id == call_id)
            ).one()
        return _run(row)

    def finish(self, *, turn_id: str, call_id: str, status: ToolRunStatus, output: str, now: datetime) -> bool:
        """Record the call's outcome unless one is recorded already; returns whether this one was."""
        with one_statement(self._db) as conn:
            result = conn.execute(
                update(ToolRunRow)
                .where(ToolRunRow.turn_id == turn_id, ToolRunRow.call_id == call_id, ToolRunRow.status == "started")
                .values(status=status, output=output, finished_at=now)
            )
        return bool(result.rowcount)

    def for_turn(self, turn_id: str) -> dict[str, ToolRun]:
        """Every recorded call of the turn, by call id."""
        with self._db() as orm:
            rows = orm.scalars(select(ToolRunRow).where(ToolRunRow.turn_id == turn_id)).all()
        return {row.call_id: _run(row) for row in rows}


def _run(row: ToolRunRow | Row[Any]) -> ToolRun:
    status: ToolRunStatus = row.status  # type: ignore[assignment]  # only ToolRunStatus values are written
    return ToolRun(status=status, output=row.output, worker=row.worker)
