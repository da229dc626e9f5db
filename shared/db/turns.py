"""TurnRepository: turns, their transcript items and provider-state snapshots.

It takes and returns the records of ``shared.db.records``; its statements and row conversions are
in ``shared.db.turn_sql``. It sends nothing and calls nobody back: a write that ends or pauses a turn
records its webhook event in the same transaction (``shared.db.webhook_outbox``) and returns the
deliveries' ids, which the caller sends once committed; a write whose broker message must go out
before its commit (a new turn, a resume) is a context manager (``creating``,
``accepting_tool_results``) that writes, yields what it wrote to the caller's block, which sends,
and commits when the block ends.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db import turn_sql as sql
from shared.db.engine import one_statement
from shared.db.records import Committed, Ended, InFlightTurn, NewTurn, Started, TurnOutcome, TurnRecord
from shared.db.sessions import insert_session
from shared.db.tables import ProviderSnapshotRow, TranscriptItemRow, TurnRow
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import UNFINISHED_STATUSES, TurnStatus
from shared.result import ErrorInfo

__all__ = [
    "Committed",
    "Created",
    "Ended",
    "IdempotencyConflict",
    "InFlightTurn",
    "NewTurn",
    "SessionBusy",
    "TurnOutcome",
    "TurnRecord",
    "TurnRepository",
]


_CANCEL_CHUNK = 1000
"""Ids per ``IN (...)`` list of a bulk read or write."""


class SessionBusy(Exception):
    """The session already has an unfinished turn."""


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request."""


@dataclass(slots=True)
class Created:
    """What :meth:`TurnRepository.creating` recorded: the turn, and whether this call writes it (False: the
    earlier turn of its idempotency key, the same request). Read it again after the block: the commit
    may have found the key taken meanwhile and put the earlier turn here."""

    turn: TurnRecord
    new: bool


class TurnRepository:
    """Reads and writes of the turn aggregate."""

    def __init__(self, db: sessionmaker[Session], *, webhooks: WebhookOutbox | None = None) -> None:
        """Build the repository.

        Args:
            db: the session factory.
            webhooks: records each turn's webhook event in the transaction that ends or pauses it
                (the ids come back to the caller, to send); None when no organisation gets webhooks.
        """
        self._db = db
        self._webhooks = webhooks
        self._on_postgresql = db.kw["bind"].dialect.name == "postgresql"

    @contextmanager
    def creating(self, turn: NewTurn, *, now: datetime, deadline_at: datetime) -> Iterator[Created]:
        """Record a queued turn in a transaction that stays open for the caller's block.

        The row is written when the block starts and committed when it ends; if the block raises,
        nothing is recorded. The gateway sends the turn's first step in the block: if the process
        dies after sending, the message finds no turn and is dropped. Either way no turn is left
        queued with no message. A key used before gives the block its earlier turn (``new`` False)
        with no transaction open: the block sends nothing.

        Yields:
            The turn and whether this call writes it. The commit may still find the key taken by
            the same request meanwhile: ``created`` then holds the earlier turn after the block.

        Raises:
            SessionBusy: the session has an unfinished turn (when the row is written or at the commit).
            IdempotencyConflict: the key was used with a different request (likewise).
        """
        if turn.idempotency_key is not None:
            earlier = self._by_idempotency_key(turn.org_id, turn.idempotency_key)
            if earlier is not None:
                yield Created(self._same_request(earlier, turn), new=False)
                return
        row = sql.new_turn_row(turn, now=now, deadline_at=deadline_at)
        created: Created | None = None
        phase = "write"
        try:
            with self._db.begin() as orm:
                orm.add(row)
                orm.flush()
                created = Created(sql.to_record(row), new=True)
                phase = "block"
                yield created
                phase = "commit"
        except IntegrityError as exc:
            if phase == "block":
                raise  # the block's own, not this write's
            earlier = self._taken(turn, exc)
            if created is None:
                yield Created(earlier, new=False)
            else:
                created.turn, created.new = earlier, False

    def create(self, turn: NewTurn, *, now: datetime, deadline_at: datetime) -> tuple[TurnRecord, bool]:
        """:meth:`creating` with nothing to do before the commit: the turn and whether it was created.

        Raises:
            SessionBusy, IdempotencyConflict: as :meth:`creating`.
        """
        with self.creating(turn, now=now, deadline_at=deadline_at) as created:
            pass
        return created.turn, created.new

    def get(self, turn_id: str, *, org_id: str | None = None) -> TurnRecord | None:
        """The turn, scoped to ``org_id`` when given."""
        with self._db() as orm:
            row = orm.get(TurnRow, turn_id)
        if row is None or (org_id is not None and row.org_id != org_id):
            return None
        return sql.to_record(row)

    def for_session(self, session_id: str) -> list[TurnRecord]:
        """The session's turns, oldest first."""
        with self._db() as orm:
            rows = orm.scalars(select(TurnRow).where(TurnRow.session_id == session_id).order_by(TurnRow.created_at))
            return [sql.to_record(row) for row in rows]

    def start(
        self, turn_id: str, *, now: datetime, deadline_at: datetime, modes: sql.SessionModes | None = None
    ) -> Started | None:
        """The turn's start, if it never started: a queued turn moves to running (its deadline pushed) and its
        record comes back from the same statement; None when it is not queued (started, finished or unknown).

        With ``modes``, a new session's turn also creates its session (mode: ``modes.of`` the requested one) in
        the same write: on PostgreSQL one statement in autocommit (:func:`~shared.db.turn_sql.start_statement`),
        one round trip where the start and the session's insert were two; on SQLite one transaction. A session
        that exists already is left as it is (:attr:`Started.created_mode` None).
        """
        values: dict[str, Any] = {"p_turn_id": turn_id, "p_now": now, "p_deadline": deadline_at}
        if modes is None:
            with one_statement(self._db) as conn:
                row = conn.execute(sql.START_QUEUED, values).first()
            return None if row is None else Started(sql.to_record(row))
        if self._on_postgresql:
            values |= {"p_modes": list(modes.known), "p_default_mode": modes.default}
            with one_statement(self._db) as conn:
                row = conn.execute(sql.start_statement(), values).first()
            return None if row is None else Started(sql.to_record(row), row.created_mode)
        with self._db.begin() as orm:
            row = orm.execute(sql.START_QUEUED, values).first()
            if row is None:
                return None
            record = sql.to_record(row)
            if not record.new_session:
                return Started(record)
            mode = modes.of(record.requested_mode)
            created = insert_session(
                orm.connection(), session_id=record.session_id, org_id=record.org_id, user_id=record.user_id,
                mode=mode, now=now,
            )  # fmt: skip
        return Started(record, mode if created else None)

    def mark_running(self, turn_id: str, *, now: datetime, deadline_at: datetime) -> bool:
        """Move a queued turn to running (the turn's start); False when it already finished (e.g. cancelled)."""
        with one_statement(self._db) as conn:
            result = conn.execute(sql.START, {"p_turn_id": turn_id, "p_now": now, "p_deadline": deadline_at})
        return bool(result.rowcount)

    def checkpoint(self, turn_id: str, state: dict[str, Any], *, now: datetime, deadline_at: datetime) -> None:
        """Keep ``state`` as the turn's newest durable checkpoint and push its deadline, at once (on PostgreSQL one
        statement in autocommit, one round trip; on SQLite one transaction).

        A stored checkpoint that got further (a worker that took the step over and moved on, or the
        commit point) stays: a stale worker's late checkpoint never puts the turn back.
        """
        if self._on_postgresql:
            values = sql.snapshot_values(turn_id, state, now=now, only_if_newer=True)
            values["p_deadline"] = deadline_at
            with one_statement(self._db) as conn:
                conn.execute(sql.checkpoint_statement(), values)
            return
        with self._db.begin() as orm:
            sql.upsert_snapshot(orm, turn_id, state, now=now, only_if_newer=True)
            orm.execute(sql.PUSH_DEADLINE, {"p_turn_id": turn_id, "p_deadline": deadline_at, "p_now": now})

    def statuses(self, turn_ids: list[str]) -> dict[str, TurnStatus]:
        """The status of each of ``turn_ids`` that exists (one query; the admission scheduler's sweep)."""
        if not turn_ids:
            return {}
        with self._db() as orm:
            rows = orm.execute(select(TurnRow.turn_id, TurnRow.status).where(TurnRow.turn_id.in_(turn_ids))).all()
        return {row.turn_id: TurnStatus(row.status) for row in rows}

    def overdue(self, *, now: datetime, limit: int = 500) -> list[InFlightTurn]:
        """Queued or running turns whose deadline passed, the most overdue first."""
        with self._db() as orm:
            rows = orm.execute(sql.OVERDUE, {"p_now": now, "p_limit": limit}).all()
        return [InFlightTurn(r.turn_id, TurnStatus(r.status), r.round, r.batch_id, r.redrives, r.org_id) for r in rows]

    def set_deadlines(self, deadlines: dict[str, datetime]) -> None:
        """Move the deadlines of turns that are still in flight (one transaction)."""
        if not deadlines:
            return
        with self._db.begin() as orm:
            moves = [{"p_turn_id": turn_id, "p_deadline": at} for turn_id, at in deadlines.items()]
            orm.execute(sql.SET_DEADLINE, moves)

    def note_redrive(self, turn_id: str, *, deadline_at: datetime) -> None:
        """Count one re-drive of the turn and give it a new deadline."""
        with self._db.begin() as orm:
            orm.execute(
                update(TurnRow)
                .where(TurnRow.turn_id == turn_id, TurnRow.status.in_(sql.IN_FLIGHT))
                .values(deadline_at=deadline_at, redrives=TurnRow.redrives + 1)
            )

    def commit(
        self,
        turn_id: str,
        outcome: TurnOutcome,
        *,
        transcript: list[tuple[str, str]],
        snapshot: dict[str, Any],
        now: datetime,
        org_id: str | None = None,
    ) -> Committed | None:
        """The commit point: the turn's outcome, transcript items, state snapshot and session's last use, at once.

        Idempotent: writing the same outcome twice leaves the same rows. A turn that already
        reached a terminal status (cancelled, say) is left as it is. With a webhook outbox, the same
        transaction records the status's webhook event (``shared.db.webhook_outbox``).

        On PostgreSQL, when no webhook event is to be recorded (no outbox, or ``org_id``, the turn's
        organisation, gets none), the commit is one statement in autocommit (``sql.commit_statement``):
        one round trip instead of seven.

        Returns:
            What was written, with the webhook deliveries to send now; None when the turn was already
            terminal and nothing was written.
        """
        webhooks = self._webhooks is not None and (org_id is None or self._webhooks.applies_to(org_id))
        if self._on_postgresql and not webhooks:
            one = sql.commit_statement(in_flight=outcome.status.is_in_flight)
            values = sql.commit_values(turn_id, outcome, transcript=transcript, snapshot=snapshot, now=now)
            with one_statement(self._db) as conn:
                written = conn.execute(one, values).one_or_none()
            return None if written is None else Committed([])
        statement = sql.FINISH_IN_FLIGHT if outcome.status.is_in_flight else sql.FINISH
        deliveries: list[str] = []
        self._prepare_webhooks()
        with self._db.begin() as orm:
            # The UPDATE locks the row until the commit, as SELECT ... FOR UPDATE did; it changes
            # nothing when the turn is unknown or already ended otherwise (cancelled, say).
            written = orm.execute(statement, sql.finish_values(turn_id, outcome, now=now)).one_or_none()
            if written is None:
                return None
            session_id, org_id = written
            orm.execute(sql.CLEAR_TRANSCRIPT, {"p_turn_id": turn_id})
            if transcript:
                items = [
                    {"session_id": session_id, "turn_id": turn_id, "seq": seq, "role": role, "content": content,
                     "created_at": now}
                    for seq, (role, content) in enumerate(transcript)
                ]  # fmt: skip
                orm.execute(sql.ADD_TRANSCRIPT, items)
            sql.upsert_snapshot(orm, turn_id, snapshot, now=now)
            orm.execute(sql.TOUCH_SESSION, {"p_session_id": session_id, "p_now": now})
            if self._webhooks is not None and self._webhooks.applies_to(org_id):
                row = orm.get(TurnRow, turn_id, populate_existing=True)
                if row is not None:
                    deliveries = self._webhooks.record_turn(orm, row, now=now)
        return Committed(deliveries)

    @contextmanager
    def accepting_tool_results(
        self, turn_id: str, *, results: list[dict[str, str]], now: datetime, deadline_at: datetime
    ) -> Iterator[int | None]:
        """Move a turn waiting for client tools back to running with the posted results, in a
        transaction that stays open for the caller's block.

        The change is written when the block starts and committed when it ends; if the block
        raises, nothing changes (the gateway sends the re-entry in the block, as for new turns).

        Yields:
            The new round number, or None when the turn was not waiting (a concurrent post won):
            nothing was written and the block sends nothing.
        """
        with self._db.begin() as orm:
            row = orm.get(TurnRow, turn_id, with_for_update=True)
            if row is None or row.status != TurnStatus.REQUIRES_CLIENT_TOOLS.value:
                yield None
                return
            # The round that paused stays readable (a response is one round: shared.openai.ids).
            paused = {
                "round": row.round, "at": row.updated_at.isoformat(), "pending_tool_calls": row.pending_tool_calls,
                "output_text": row.output_text, "usage": row.usage, "mode": row.mode, "mode_changes": row.mode_changes,
            }  # fmt: skip
            row.paused_rounds = [*(row.paused_rounds or []), paused]
            row.round += 1
            row.status = TurnStatus.RUNNING.value
            row.client_tool_results = results
            row.pending_tool_calls = []
            row.updated_at = now
            row.deadline_at = deadline_at
            orm.flush()
            yield row.round

    def accept_tool_results(
        self, turn_id: str, *, results: list[dict[str, str]], now: datetime, deadline_at: datetime
    ) -> int | None:
        """:meth:`accepting_tool_results` with nothing to do before the commit: the new round, or None."""
        with self.accepting_tool_results(turn_id, results=results, now=now, deadline_at=deadline_at) as round_:
            pass
        return round_

    def finish_early(
        self,
        turn_id: str,
        *,
        status: TurnStatus,
        error: ErrorInfo,
        now: datetime,
        only_if: Collection[str] = UNFINISHED_STATUSES,
    ) -> Ended | None:
        """End a turn from outside the pipeline if its status is in ``only_if`` (for ``shared.turn_ending``).

        With a webhook outbox, the same transaction records the turn's webhook event.

        Returns:
            The ended turn (one record) with the webhook deliveries to send now, or None when the turn
            was not in one of those statuses.
        """
        deliveries: list[str] = []
        self._prepare_webhooks()
        with self._db.begin() as orm:
            row = orm.get(TurnRow, turn_id, with_for_update=True)
            if row is None or row.status not in only_if:
                return None
            row.status = status.value
            row.error = error.model_dump(mode="json")
            row.pending_tool_calls = []
            row.updated_at = now
            row.completed_at = now
            row.deadline_at = None
            row.trace = [
                *row.trace,
                {"seq": len(row.trace) + 1, "kind": "turn_" + status.value, "at": now.isoformat(),
                 "step": "gateway", "worker": "gateway", "duration_ms": None,
                 "data": {"code": error.code.value, "message": error.message}},
            ]  # fmt: skip
            if self._webhooks is not None:
                orm.flush()
                deliveries = self._webhooks.record_turn(orm, row, now=now)
        return Ended([sql.to_record(row)], deliveries)

    def cancel_queued(self, turn_ids: Sequence[str], *, error: ErrorInfo, now: datetime) -> Ended:
        """Cancel those of ``turn_ids`` still queued (never started): one ``UPDATE`` per 1,000 ids, one transaction.

        A queued turn's trace is empty, so it becomes the one ``turn_cancelled`` record ``finish_early``
        would add. With a webhook outbox, the same transaction records each turn's webhook event (and
        its batch's, once).

        Returns:
            The turns this call cancelled (a turn that started meanwhile is left to run), with the
            webhook deliveries to send now.
        """
        trace = [
            {"seq": 1, "kind": "turn_" + TurnStatus.CANCELLED.value, "at": now.isoformat(), "step": "gateway",
             "worker": "gateway", "duration_ms": None, "data": {"code": error.code.value, "message": error.message}}
        ]  # fmt: skip
        values = {
            "status": TurnStatus.CANCELLED.value, "error": error.model_dump(mode="json"), "pending_tool_calls": [],
            "updated_at": now, "completed_at": now, "deadline_at": None, "trace": trace,
        }  # fmt: skip
        cancelled: list[TurnRow] = []
        deliveries: list[str] = []
        self._prepare_webhooks()
        with self._db.begin() as orm:
            for start in range(0, len(turn_ids), _CANCEL_CHUNK):
                chunk = list(turn_ids[start : start + _CANCEL_CHUNK])
                statement = (
                    update(TurnRow)
                    .where(TurnRow.turn_id.in_(chunk), TurnRow.status == TurnStatus.QUEUED.value)
                    .values(values)
                    .returning(TurnRow)
                    .execution_options(synchronize_session=False)
                )
                cancelled.extend(orm.scalars(statement))
            if self._webhooks is not None and cancelled:
                deliveries = self._webhooks.record_turns(orm, cancelled, now=now)
            records = [sql.to_record(row) for row in cancelled]
        return Ended(records, deliveries)

    def by_idempotency_keys(self, org_id: str, keys: Collection[str]) -> dict[str, TurnRecord]:
        """The organisation's turns recorded with any of ``keys``, by key."""
        found: dict[str, TurnRecord] = {}
        wanted = sorted(keys)
        with self._db() as orm:
            for start in range(0, len(wanted), _CANCEL_CHUNK):
                chunk = wanted[start : start + _CANCEL_CHUNK]
                query = select(TurnRow).where(TurnRow.org_id == org_id, TurnRow.idempotency_key.in_(chunk))
                for row in orm.scalars(query):
                    found[str(row.idempotency_key)] = sql.to_record(row)
        return found

    def overdue_waiting(self, *, older_than: datetime, session_id: str | None = None, limit: int = 500) -> list[str]:
        """Ids of turns waiting for client tools since before ``older_than``."""
        query = (
            select(TurnRow.turn_id)
            .where(TurnRow.status == TurnStatus.REQUIRES_CLIENT_TOOLS.value)
            .where(TurnRow.updated_at < older_than)
            .limit(limit)
        )
        if session_id is not None:
            query = query.where(TurnRow.session_id == session_id)
        with self._db() as orm:
            return list(orm.scalars(query))

    def load_snapshot(self, turn_id: str) -> dict[str, Any] | None:
        """The state snapshot of the turn's last commit point."""
        with self._db() as orm:
            row = orm.get(ProviderSnapshotRow, turn_id)
        return None if row is None else row.state

    def conversation(self, session_id: str, *, before: datetime, limit: int) -> list[tuple[str, str]]:
        """(role, content) of the session's last ``limit`` completed turns created before ``before``, oldest first."""
        recent = (
            select(TurnRow.turn_id, TurnRow.created_at)
            .where(TurnRow.session_id == session_id)
            .where(TurnRow.status == TurnStatus.COMPLETED.value)
            .where(TurnRow.created_at < before)
            .order_by(TurnRow.created_at.desc())
            .limit(limit)
            .subquery()
        )
        query = (
            select(TranscriptItemRow.role, TranscriptItemRow.content)
            .join(recent, recent.c.turn_id == TranscriptItemRow.turn_id)
            .order_by(recent.c.created_at, TranscriptItemRow.seq)
        )
        with self._db() as orm:
            return [(role, content) for role, content in orm.execute(query).all()]

    def _prepare_webhooks(self) -> None:
        if self._webhooks is not None:
            self._webhooks.prepare()

    def _by_idempotency_key(self, org_id: str, key: str) -> TurnRecord | None:
        with self._db() as orm:
            row = orm.scalar(select(TurnRow).where(TurnRow.org_id == org_id, TurnRow.idempotency_key == key))
        return None if row is None else sql.to_record(row)

    def _taken(self, turn: NewTurn, exc: IntegrityError) -> TurnRecord:
        """What a unique index refusing ``turn`` means: the earlier turn of its key (the same request), or a refusal.

        Raises:
            IdempotencyConflict: the key's earlier turn came with a different request.
            SessionBusy: no turn has the key; the session has an unfinished turn.
        """
        if turn.idempotency_key is not None:
            earlier = self._by_idempotency_key(turn.org_id, turn.idempotency_key)
            if earlier is not None:
                return self._same_request(earlier, turn)
        raise SessionBusy(turn.session_id) from exc

    @staticmethod
    def _same_request(earlier: TurnRecord, turn: NewTurn) -> TurnRecord:
        if earlier.request_hash != turn.request_hash:
            raise IdempotencyConflict(turn.idempotency_key)
        return earlier
