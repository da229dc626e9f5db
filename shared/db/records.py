"""Turn records: the one description of a turn on each side of the persistence boundary.

Which fields each shape of a turn carries is said here, once:

- ``NewTurn``: what the gateway records when it accepts a turn (its request and identity).
- ``TurnOutcome``: what the commit point writes (``TurnRepository.commit``); a turn's
  ``TurnState`` holds each of these fields under the same name, so ``TurnOutcome.of(state)``
  takes them without a hand-written copy.
- ``TurnRecord``: a turn as read back, the ``NewTurn`` it started as plus its stored outcome and
  bookkeeping; its field names are the ``turns`` table's columns, and the outcome's JSON columns
  stay JSON (``error["code"]``, ``trace[0]["kind"]``).
- ``IDENTITY_FIELDS``: what a starting turn's state copies from its record (the snapshot, being
  the state itself, carries them on).
- ``Committed``, ``Ended``: what a commit or an early end wrote, with the webhook deliveries it
  recorded in the same transaction (the outbox, ``shared.db.webhook_outbox``), which the caller
  sends once it committed (``shared.webhooks.WebhookSender``).

Plain frozen dataclasses: no SQLAlchemy object leaves ``shared.db``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from shared.models.trace import TraceStep
from shared.models.turn import JsonObject, ModeChange, PendingToolCall, TurnStatus, Usage
from shared.result import ErrorInfo

__all__ = [
    "IDENTITY_FIELDS", "Committed", "Ended", "InFlightTurn", "NewTurn", "Started", "TurnOutcome", "TurnRecord",
]  # fmt: skip

IDENTITY_FIELDS: tuple[str, ...] = (
    "turn_id", "session_id", "org_id", "user_id", "batch_id", "new_session", "requested_mode",
)  # fmt: skip
"""The ``NewTurn`` fields a turn's state carries, under the same names, from its start to its snapshot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NewTurn:
    """What the gateway records when it accepts a turn."""

    turn_id: str
    session_id: str
    org_id: str
    user_id: str
    new_session: bool
    """True when this turn creates its session (the request named none)."""
    requested_mode: str | None
    """The mode the request asked for, if any."""
    request: JsonObject
    """The request as accepted (without its idempotency key)."""
    request_hash: str
    """Tells a repeated idempotency key with the same request from one with another."""
    idempotency_key: str | None = None
    batch_id: str | None = None
    batch_index: int | None = None
    """The turn's position in its batch's requests."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnOutcome:
    """What a turn's commit point writes: its status and result so far."""

    status: TurnStatus
    mode: str | None
    output_text: str | None
    pending_tool_calls: list[PendingToolCall]
    mode_changes: list[ModeChange]
    error: ErrorInfo | None
    usage: Usage
    trace: list[TraceStep]

    @classmethod
    def of(cls, state: object) -> TurnOutcome:
        """The outcome a turn's state holds, field by field under the same names.

        Args:
            state: a ``TurnState`` (or anything with this class's fields as attributes).

        Returns:
            The outcome to commit.
        """
        return cls(**{name: getattr(state, name) for name in _OUTCOME_FIELDS})

    def columns(self) -> dict[str, Any]:
        """The outcome as the ``turns`` table stores it: JSON-ready values by column name."""
        return {
            "status": self.status.value,
            "mode": self.mode,
            "output_text": self.output_text,
            "pending_tool_calls": [call.model_dump() for call in self.pending_tool_calls],
            "mode_changes": [change.model_dump(by_alias=True) for change in self.mode_changes],
            "error": None if self.error is None else self.error.model_dump(mode="json"),
            "usage": self.usage.model_dump(),
            "trace": [step.model_dump(mode="json") for step in self.trace],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord(NewTurn):
    """A recorded turn as read back: the ``NewTurn`` it started as, its stored outcome and bookkeeping."""

    status: TurnStatus
    mode: str | None
    """The mode the turn ran in, once it ran."""
    output_text: str | None
    pending_tool_calls: list[JsonObject]
    mode_changes: list[JsonObject]
    """As stored: ``ModeChange`` dumped by alias (``from``/``to``)."""
    error: JsonObject | None
    usage: JsonObject
    trace: list[JsonObject]
    round: int
    """How many times the turn was entered; bumped by each accepted tool-results post."""
    client_tool_results: list[JsonObject] | None
    """The client tool outputs of the latest re-entry, as posted."""
    paused_rounds: list[JsonObject]
    """The rounds that ended paused for client tools, as each stood at its pause (``{round, at,
    pending_tool_calls, output_text, usage, mode, mode_changes}``), written when its results were accepted."""
    deadline_at: datetime | None
    """While queued or running: when the reconciler checks that the turn still moves."""
    redrives: int
    """How often the reconciler re-drove the turn."""
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None

    def identity(self) -> dict[str, Any]:
        """The fields of ``IDENTITY_FIELDS``, by name: what a starting ``TurnState`` copies."""
        return {name: getattr(self, name) for name in IDENTITY_FIELDS}


@dataclass(frozen=True, slots=True)
class Started:
    """A turn's start (``TurnRepository.start``): its record as it now is, and the session the same write created."""

    turn: TurnRecord
    created_mode: str | None = None
    """The mode of the new session the start created; None when it created none (not asked to, not a new session's
    turn, or the session was there already)."""


@dataclass(frozen=True, slots=True)
class InFlightTurn:
    """What the reconciler needs of a queued or running turn past its deadline."""

    turn_id: str
    status: TurnStatus
    round: int
    batch_id: str | None
    redrives: int
    org_id: str = ""
    """The turn's organisation (its admission sets, ``shared.state.admission``)."""


@dataclass(frozen=True, slots=True)
class Committed:
    """A commit point that wrote (``TurnRepository.commit``)."""

    deliveries: list[str]
    """The webhook deliveries it recorded, for the caller to send now that they are committed."""


@dataclass(frozen=True, slots=True)
class Ended:
    """Turns an early end wrote (``TurnRepository.finish_early``, ``cancel_queued``)."""

    records: list[TurnRecord]
    """The turns as ended."""
    deliveries: list[str]
    """The webhook deliveries it recorded (the turns' events, their batches'), for the caller to send
    now that they are committed."""


_OUTCOME_FIELDS = tuple(field.name for field in fields(TurnOutcome))
