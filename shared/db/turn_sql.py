"""The turns table's side of the turn records: prebuilt statements and the row <-> record conversions.

The statements of the hot path are built once: a statement object built per call makes SQLAlchemy
compute its cache key again each time (measured: a third of a checkpoint's CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Row,
    Select,
    String,
    Table,
    Text,
    any_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert, ReturningUpdate, Update
from sqlalchemy.sql.elements import BindParameter

from shared.db.records import NewTurn, TurnOutcome, TurnRecord
from shared.db.tables import ProviderSnapshotRow, SessionRow, TranscriptItemRow, TurnRow
from shared.models.turn import TurnStatus, Usage

__all__ = [
    "ADD_TRANSCRIPT",
    "CLEAR_TRANSCRIPT",
    "FINISH",
    "FINISH_IN_FLIGHT",
    "IN_FLIGHT",
    "OVERDUE",
    "PUSH_DEADLINE",
    "SET_DEADLINE",
    "START",
    "START_QUEUED",
    "TERMINAL",
    "TOUCH_SESSION",
    "SessionModes",
    "checkpoint_statement",
    "commit_statement",
    "commit_values",
    "finish_values",
    "new_turn_row",
    "new_turn_values",
    "snapshot_values",
    "start_statement",
    "to_record",
    "upsert_snapshot",
]

TERMINAL = tuple(status.value for status in TurnStatus if status.is_terminal)
"""``TurnStatus.terminal()`` as column values, in a fixed order (a stable statement cache key)."""
IN_FLIGHT = tuple(status.value for status in TurnStatus if status.is_in_flight)
"""``TurnStatus.in_flight()`` as column values, in a fixed order."""

_TURNS: Table = TurnRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_SNAPSHOTS: Table = ProviderSnapshotRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_RECORD_FIELDS = tuple(field.name for field in fields(TurnRecord))
_STARTED = {
    "status": TurnStatus.RUNNING.value, "updated_at": bindparam("p_now"), "deadline_at": bindparam("p_deadline")
}  # fmt: skip
"""What a turn's start writes: running, with a fresh reconciler deadline."""
START: Update = (
    update(_TURNS).where(_TURNS.c.turn_id == bindparam("p_turn_id"), _TURNS.c.status.notin_(TERMINAL)).values(_STARTED)
)
START_QUEUED: ReturningUpdate[Any] = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), _TURNS.c.status == TurnStatus.QUEUED.value)
    .values(_STARTED)
    .returning(*(_TURNS.c[name] for name in _RECORD_FIELDS))
)
"""``START`` of a turn that never started, returning its record (as it is after the start) in the same statement."""


@dataclass(frozen=True, slots=True)
class SessionModes:
    """How the session a turn's start creates gets its mode (AGN-011 §3.1): the requested mode if the catalog knows it,
    else the catalog's default (an unknown mode was refused at the gateway; one that left the catalog since falls
    back)."""

    known: tuple[str, ...]
    default: str

    def of(self, requested: str | None) -> str:
        """The mode of a session whose turn asked for ``requested``."""
        return requested if requested in self.known else self.default


def start_statement() -> Select[Any]:
    """``START_QUEUED`` that also creates a new session's row, on PostgreSQL: one statement, one round trip where the
    two are two. Its row is the started turn's record and ``created_mode``: the mode of the session it created (NULL
    when the turn is not a new session's, its session existed, or it did not start). Parameters: ``p_turn_id``,
    ``p_now``, ``p_deadline``, ``p_modes`` (:attr:`SessionModes.known`, a list), ``p_default_mode``."""
    global _START_WITH_SESSION
    if _START_WITH_SESSION is None:
        started = START_QUEUED.cte("started")
        requested = started.c.requested_mode
        mode = case(
            (requested == any_(bindparam("p_modes", type_=postgresql.ARRAY(String))), requested),
            else_=bindparam("p_default_mode", type_=String),
        )
        at = bindparam("p_now", type_=_SESSIONS.c.created_at.type)
        created = (
            postgresql.insert(_SESSIONS)
            .from_select(
                ["session_id", "org_id", "user_id", "mode", "version", "created_at", "updated_at"],
                select(started.c.session_id, started.c.org_id, started.c.user_id, mode, literal(1), at, at).where(
                    started.c.new_session
                ),
            )
            .on_conflict_do_nothing(index_elements=["session_id"])
            .returning(_SESSIONS.c.mode)
            .cte("created")
        )
        statement: Select[Any] = select(*started.c, created.c.mode.label("created_mode"))
        _START_WITH_SESSION = statement.select_from(started.outerjoin(created, true()))
    return _START_WITH_SESSION


_START_WITH_SESSION: Select[Any] | None = None
PUSH_DEADLINE: Update = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), _TURNS.c.status == TurnStatus.RUNNING.value)
    .values(deadline_at=bindparam("p_deadline"), updated_at=bindparam("p_now"))
)
SET_DEADLINE: Update = (
    update(_TURNS)
    .where(_TURNS.c.turn_id == bindparam("p_turn_id"), or_(*(_TURNS.c.status == status for status in IN_FLIGHT)))
    .values(deadline_at=bindparam("p_deadline"))
)
"""The reconciler's move of a turn still moving (one executemany per scan batch: hence no ``IN``,
which SQLAlchemy expands per call)."""
OVERDUE = (
    select(_TURNS.c.turn_id, _TURNS.c.status, _TURNS.c.round, _TURNS.c.batch_id, _TURNS.c.redrives, _TURNS.c.org_id)
    .where(_TURNS.c.status.in_(IN_FLIGHT), _TURNS.c.deadline_at < bindparam("p_now"))
    .order_by(_TURNS.c.deadline_at)
    .limit(bindparam("p_limit"))
)
_TRANSCRIPT: Table = TranscriptItemRow.__table__  # type: ignore[assignment]  # a declarative class's __table__ is a Table
_FINISH_VALUES: dict[str, BindParameter[Any]] = {
    name: bindparam(f"p_{name}")
    for name in (*(field.name for field in fields(TurnOutcome)), "updated_at", "completed_at")
}
"""A commit writes the outcome's fields (``TurnOutcome.columns``), its time and, once terminal, its end."""
_FINISH_WHERE = (
    _TURNS.c.turn_id == bindparam("p_turn_id"),
    or_(_TURNS.c.status.notin_(TERMINAL), _TURNS.c.status == bindparam("p_status")),
)
FINISH: ReturningUpdate[str, str] = (
    update(_TURNS)
    .where(*_FINISH_WHERE)
    .values({**_FINISH_VALUES, "deadline_at": None})
    .returning(_TURNS.c.session_id, _TURNS.c.org_id)
)
"""The commit of a turn that leaves the in-flight statuses (its deadline goes); returns its session and org."""
FINISH_IN_FLIGHT: ReturningUpdate[str, str] = (
    update(_TURNS).where(*_FINISH_WHERE).values(_FINISH_VALUES).returning(_TURNS.c.session_id, _TURNS.c.org_id)
)
TOUCH_SESSION = (
    update(_SESSIONS).where(_SESSIONS.c.session_id == bindparam("p_session_id")).values(updated_at=bindparam("p_now"))
)
"""A turn's commit is its session's last use."""
CLEAR_TRANSCRIPT = delete(_TRANSCRIPT).where(_TRANSCRIPT.c.turn_id == bindparam("p_turn_id"))
ADD_TRANSCRIPT = insert(_TRANSCRIPT)
_UPSERT_SNAPSHOT: dict[tuple[str, bool], Insert] = {}
_CHECKPOINT: Update | None = None
_COMMIT: dict[bool, Select[Any]] = {}
_STORED_PROGRESS = {
    "postgresql": "(SELECT count(*) FROM json_object_keys(provider_snapshots.state -> 'steps_done'))",
    "sqlite": "(SELECT count(*) FROM json_each(provider_snapshots.state, '$.steps_done'))",
}
"""How far the stored checkpoint got: the number of its ``steps_done`` (a plain JSON column on both)."""
_NEW_TURN_FIELDS = tuple(field.name for field in fields(NewTurn))


def finish_values(turn_id: str, outcome: TurnOutcome, *, now: datetime) -> dict[str, Any]:
    """The parameters of ``FINISH`` / ``FINISH_IN_FLIGHT`` for committing ``outcome`` now."""
    values = {f"p_{name}": value for name, value in outcome.columns().items()}
    values.update(p_turn_id=turn_id, p_updated_at=now, p_completed_at=now if outcome.status.is_terminal else None)
    return values


def new_turn_row(turn: NewTurn, *, now: datetime, deadline_at: datetime) -> TurnRow:
    """The row of a newly accepted (queued) turn: the ``NewTurn``'s fields and an empty outcome."""
    return TurnRow(**new_turn_values(turn, now=now, deadline_at=deadline_at))


def new_turn_values(turn: NewTurn, *, now: datetime, deadline_at: datetime) -> dict[str, Any]:
    """The columns of a newly accepted (queued) turn, for a bulk ``INSERT`` (``new_turn_row``'s values)."""
    return {
        **{name: getattr(turn, name) for name in _NEW_TURN_FIELDS},
        "status": TurnStatus.QUEUED.value,
        "mode": None,
        "pending_tool_calls": [],
        "mode_changes": [],
        "usage": Usage().model_dump(),
        "trace": [],
        "created_at": now,
        "updated_at": now,
        "deadline_at": deadline_at,
        "redrives": 0,
        "round": 0,
        "paused_rounds": [],
    }


def to_record(row: TurnRow | Row[Any]) -> TurnRecord:
    """The record of a turn row, or of a statement's row of the same columns (its columns are the record's fields)."""
    values = {name: getattr(row, name) for name in _RECORD_FIELDS}
    values["status"] = TurnStatus(row.status)
    return TurnRecord(**values)


def upsert_snapshot(
    orm: Session, turn_id: str, state: dict[str, Any], *, now: datetime, only_if_newer: bool = False
) -> None:
    """Insert or replace the turn's checkpoint in one statement, in ``orm``'s transaction.

    With ``only_if_newer`` a stored checkpoint that got further (more ``steps_done``: steps only ever
    add to it) is left as it is: a worker that lost its step's lease (cut off from Redis and
    PostgreSQL, say) and comes back with the step's result never puts the turn back behind what the
    worker that took the step over recorded since.
    """
    statement = _upsert_snapshot(orm.get_bind().dialect.name, only_if_newer=only_if_newer)
    orm.execute(statement, snapshot_values(turn_id, state, now=now, only_if_newer=only_if_newer))


def snapshot_values(turn_id: str, state: dict[str, Any], *, now: datetime, only_if_newer: bool) -> dict[str, Any]:
    """The parameters of a checkpoint's upsert (``upsert_snapshot``, ``checkpoint_statement``)."""
    values = {"p_turn_id": turn_id, "p_state": state, "p_now": now}
    if only_if_newer:
        values["p_progress"] = len(state.get("steps_done") or {})
    return values


def checkpoint_statement() -> Update:
    """PostgreSQL's checkpoint of a running turn as one statement: the snapshot's upsert (``only_if_newer``)
    in a data-modifying ``WITH``, and the turn's deadline push. Sent in autocommit, it is one round trip
    where a transaction of the two is four (``BEGIN``, the two, ``COMMIT``); a statement is atomic by itself.
    SQLite has no data-modifying ``WITH``: it runs the two in a transaction."""
    global _CHECKPOINT
    if _CHECKPOINT is None:
        snapshot = _upsert_snapshot("postgresql", only_if_newer=True).cte("snapshot")
        _CHECKPOINT = PUSH_DEADLINE.add_cte(snapshot)
    return _CHECKPOINT


def _upsert_snapshot(dialect_name: str, *, only_if_newer: bool) -> Insert:
    statement = _UPSERT_SNAPSHOT.get((dialect_name, only_if_newer))
    if statement is None:
        dialect = postgresql if dialect_name == "postgresql" else sqlite
        insert = dialect.insert(_SNAPSHOTS).values(
            turn_id=bindparam("p_turn_id"), state=bindparam("p_state"), updated_at=bindparam("p_now")
        )
        # The state goes over the wire (and through the JSON encoder) once: the update takes the
        # row the insert proposed.
        replace = {"state": insert.excluded.state, "updated_at": insert.excluded.updated_at}
        where = text(f"{_STORED_PROGRESS[dialect_name]} <= :p_progress") if only_if_newer else None
        statement = insert.on_conflict_do_update(index_elements=["turn_id"], set_=replace, where=where)
        _UPSERT_SNAPSHOT[(dialect_name, only_if_newer)] = statement
    return statement


def commit_statement(*, in_flight: bool) -> Select[Any]:
    """PostgreSQL's commit point as one statement (sent in autocommit: one round trip, where the
    transaction of ``TurnRepository.commit`` is seven): ``FINISH`` (or ``FINISH_IN_FLIGHT`` for a turn
    that pauses) in a data-modifying ``WITH``, and, only when it wrote, the transcript (its items
    upserted by ``(turn_id, seq)``, any beyond them deleted), the snapshot's upsert and the session's
    last use. It returns the turn's ``(session_id, org_id)``, or no row when the turn had ended
    otherwise. The parts touch different rows, so the order PostgreSQL runs them in does not matter.
    Parameters: ``commit_values``."""
    if in_flight in _COMMIT:
        return _COMMIT[in_flight]
    finished = (FINISH_IN_FLIGHT if in_flight else FINISH).cte("finished")
    wrote = exists(select(finished.c.session_id))
    cleared = delete(_TRANSCRIPT).where(
        _TRANSCRIPT.c.turn_id == bindparam("p_turn_id"), _TRANSCRIPT.c.seq >= bindparam("p_items"), wrote
    )
    items = (
        func.unnest(
            bindparam("p_roles", type_=postgresql.ARRAY(Text)), bindparam("p_contents", type_=postgresql.ARRAY(Text))
        )
        .table_valued("role", "content", with_ordinality="ordinal")
        .render_derived()
    )
    add = postgresql.insert(_TRANSCRIPT).from_select(
        ["session_id", "turn_id", "seq", "role", "content", "created_at"],
        select(
            finished.c.session_id, bindparam("p_turn_id"), items.c.ordinal - 1, items.c.role, items.c.content,
            bindparam("p_now", type_=_TRANSCRIPT.c.created_at.type),
        ).select_from(finished).join(items, true()),
    )  # fmt: skip
    added = add.on_conflict_do_update(
        constraint="uq_transcript_turn_seq",
        set_={name: add.excluded[name] for name in ("session_id", "role", "content", "created_at")},
    )
    keep = postgresql.insert(_SNAPSHOTS).from_select(
        ["turn_id", "state", "updated_at"],
        select(bindparam("p_turn_id"), bindparam("p_state", type_=_SNAPSHOTS.c.state.type), bindparam("p_now")).where(
            wrote
        ),
    )
    kept = keep.on_conflict_do_update(
        index_elements=["turn_id"], set_={"state": keep.excluded.state, "updated_at": keep.excluded.updated_at}
    )
    touched = (
        update(_SESSIONS).where(_SESSIONS.c.session_id == finished.c.session_id).values(updated_at=bindparam("p_now"))
    )
    written: Select[Any] = select(finished.c.session_id, finished.c.org_id)
    _COMMIT[in_flight] = written.add_cte(
        cleared.cte("cleared"), added.cte("added"), kept.cte("kept"), touched.cte("touched")
    )
    return _COMMIT[in_flight]


def commit_values(
    turn_id: str, outcome: TurnOutcome, *, transcript: list[tuple[str, str]], snapshot: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The parameters of ``commit_statement``."""
    values = finish_values(turn_id, outcome, now=now)
    values.update(
        p_items=len(transcript),
        p_roles=[role for role, _ in transcript],
        p_contents=[content for _, content in transcript],
        p_state=snapshot,
        p_now=now,
    )
    return values
