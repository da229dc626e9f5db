"""SQLAlchemy tables: sessions, mode history, turns, transcript items, provider-state snapshots, batches
(and the earlier turns they reuse), tool runs, webhook deliveries and API keys.

Portable between PostgreSQL and SQLite (plain JSON, no dialect-only types). API models live in
``shared.models``; the repositories convert between the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from shared.models.turn import TurnStatus

__all__ = [
    "ApiKeyRow",
    "ApiKeyVersionRow",
    "Base",
    "BatchReusedTurnRow",
    "BatchRow",
    "ModeHistoryRow",
    "OpenAIBatchRow",
    "OpenAIFileChunkRow",
    "OpenAIFileRow",
    "OrgSettingsRow",
    "ProviderSnapshotRow",
    "ResponseRow",
    "SessionRow",
    "ToolRunRow",
    "TranscriptItemRow",
    "TurnRow",
    "WebhookAttemptRow",
    "WebhookDeliveryRow",
    "WebhookEndpointRow",
    "WebhookSecretRow",
]


def status_in_sql(statuses: Iterable[TurnStatus]) -> str:
    """A partial index's predicate on ``status``, in TurnStatus's declaration order.

    The order keeps the text the migrations wrote (``0001``, ``0004``), so the tables and the
    migrated schema describe the same indexes.

    Args:
        statuses: the statuses the predicate admits.

    Returns:
        ``status IN ('queued', ...)``.
    """
    chosen = frozenset(statuses)
    return "status IN (" + ", ".join(f"'{status.value}'" for status in TurnStatus if status in chosen) + ")"


UNFINISHED_SQL = status_in_sql(TurnStatus.unfinished())
"""One unfinished turn per session: the predicate of ``uq_turns_one_unfinished_per_session``."""
IN_FLIGHT_SQL = status_in_sql(TurnStatus.in_flight())
"""The reconciler's scan: the predicate of ``ix_turns_in_flight_deadline``."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every database (SQLite keeps no zone; we put UTC back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored")
        return value.astimezone(UTC) if dialect.name != "sqlite" else value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every Aptix table."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime()}


class SessionRow(Base):
    """An agent session: the authoritative current mode (AGN-011 §3.2)."""

    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(128), index=True)
    user_id: Mapped[str] = mapped_column(String(128))
    mode: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """The client's own string values for the session (an OpenAI conversation's ``metadata``), or None."""


class ModeHistoryRow(Base):
    """One mode transition of a session."""

    __tablename__ = "mode_history"
    __table_args__ = (UniqueConstraint("turn_id", "seq", name="uq_mode_history_turn_seq"),)

    history_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.session_id", ondelete="CASCADE"), index=True)
    turn_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    """Order of the change within its turn; with turn_id it makes a redelivered change a no-op."""
    from_mode: Mapped[str | None] = mapped_column(String(64))
    to_mode: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    org_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    at: Mapped[datetime]


class TurnRow(Base):
    """A turn: its request, status, result, usage and trace."""

    __tablename__ = "turns"
    __table_args__ = (
        UniqueConstraint("org_id", "idempotency_key", name="uq_turns_org_idempotency_key"),
        # One unfinished turn per session, enforced by the database itself.
        Index(
            "uq_turns_one_unfinished_per_session",
            "session_id",
            unique=True,
            postgresql_where=text(UNFINISHED_SQL),
            sqlite_where=text(UNFINISHED_SQL),
        ),
        Index("ix_turns_session_created", "session_id", "created_at"),
        # GET /v1/usage and the token budget's count: an organisation's turns by day.
        Index("ix_turns_org_created", "org_id", "created_at"),
        # The reconciler's scan: turns in flight, by deadline.
        Index(
            "ix_turns_in_flight_deadline",
            "deadline_at",
            postgresql_where=text(IN_FLIGHT_SQL),
            sqlite_where=text(IN_FLIGHT_SQL),
        ),
    )

    turn_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(64))
    org_id: Mapped[str] = mapped_column(String(128), index=True)
    user_id: Mapped[str] = mapped_column(String(128))
    batch_id: Mapped[str | None] = mapped_column(String(64), index=True)
    batch_index: Mapped[int | None] = mapped_column(Integer)
    """The turn's position in its batch's requests."""
    status: Mapped[str] = mapped_column(String(32))
    new_session: Mapped[bool]
    requested_mode: Mapped[str | None] = mapped_column(String(64))
    mode: Mapped[str | None] = mapped_column(String(64))
    request: Mapped[dict[str, Any]]
    request_hash: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    output_text: Mapped[str | None] = mapped_column(Text)
    pending_tool_calls: Mapped[list[Any]] = mapped_column(default=list)
    mode_changes: Mapped[list[Any]] = mapped_column(default=list)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    usage: Mapped[dict[str, Any]] = mapped_column(default=dict)
    trace: Mapped[list[Any]] = mapped_column(default=list)
    round: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times the turn was entered; bumped by each accepted tool-results post."""
    client_tool_results: Mapped[list[Any] | None] = mapped_column(JSON)
    """The client tool outputs of the latest re-entry, as posted."""
    paused_rounds: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    """One entry per round that ended paused for client tools, written when its results were accepted:
    ``{round, at, pending_tool_calls, output_text, usage, mode, mode_changes}`` as they stood at the pause
    (a response that is such a round is rendered from it once the turn moved on)."""
    deadline_at: Mapped[datetime | None]
    """While queued or running: when the reconciler checks that the turn still moves."""
    redrives: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How often the reconciler re-drove the turn."""
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    completed_at: Mapped[datetime | None]


class TranscriptItemRow(Base):
    """One conversation item of a turn (user input, assistant answer), for the next turns' context."""

    __tablename__ = "transcript_items"
    __table_args__ = (UniqueConstraint("turn_id", "seq", name="uq_transcript_turn_seq"),)

    item_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(64), index=True)
    turn_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(32))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class ProviderSnapshotRow(Base):
    """The turn's newest durable checkpoint: its Redis state at the last model answer or commit point,
    to carry the turn on from when Redis lost it."""

    __tablename__ = "provider_snapshots"

    turn_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


class ResponseRow(Base):
    """A response of the OpenAI face: one round of a turn (``shared.openai.ids``), with what its request said.

    The turn holds what happened; this row holds what only the response's own request knows: the
    fields a ``Response`` echoes, its input items, and the ``Idempotency-Key`` it was created with.
    """

    __tablename__ = "responses"
    __table_args__ = (
        UniqueConstraint("org_id", "idempotency_key", name="uq_responses_org_idempotency_key"),
        UniqueConstraint("turn_id", "round", name="uq_responses_turn_round"),
    )

    response_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    turn_id: Mapped[str] = mapped_column(String(64))
    round: Mapped[int] = mapped_column(Integer)
    org_id: Mapped[str] = mapped_column(String(128))
    previous_response_id: Mapped[str | None] = mapped_column(String(80))
    conversation_id: Mapped[str | None] = mapped_column(String(80))
    """The conversation the request named (``conversation``), else None."""
    params: Mapped[dict[str, Any]]
    """The request's fields a ``Response`` echoes (instructions, tools, metadata, temperature, ...)."""
    input_items: Mapped[list[Any]]
    """The request's input, as items with ids (``GET /openai/v1/responses/{id}/input_items``)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    """Tells a repeated ``Idempotency-Key`` with the same body from one with another."""
    created_at: Mapped[datetime]


class BatchRow(Base):
    """A batch of turns submitted together."""

    __tablename__ = "batches"

    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(128), index=True)
    user_id: Mapped[str] = mapped_column(String(128))
    total: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    webhook_url: Mapped[str | None] = mapped_column(String(2048))
    """Where the batch's ``batch.completed`` event goes (else the organisation's default)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    """The client's key for this batch: a retried ``POST /v1/batches`` with it finds this batch."""
    request_hash: Mapped[str | None] = mapped_column(String(64))
    """Tells a repeated idempotency key with the same body from one with another."""
    reused: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many of its requests named an earlier turn by its idempotency key (``batch_reused_turns``)."""
    cancel_requested_at: Mapped[datetime | None]
    """When the client asked to cancel the batch (None: never)."""
    cancel_mode: Mapped[str | None] = mapped_column(String(16))
    """What that cancel does to running turns: ``finish`` (let them) or ``cancel`` (cancel them too)."""

    __table_args__ = (
        UniqueConstraint("org_id", "idempotency_key", name="uq_batches_org_idempotency_key"),
        # GET /v1/batches: an organisation's batches, newest first.
        Index("ix_batches_org_created", "org_id", "created_at", "batch_id"),
    )


class BatchReusedTurnRow(Base):
    """A request of a batch whose idempotency key named an earlier turn: that turn stands for it."""

    __tablename__ = "batch_reused_turns"

    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.batch_id", ondelete="CASCADE"), primary_key=True)
    batch_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    """The request's position in the batch."""
    turn_id: Mapped[str] = mapped_column(String(64))


class OpenAIFileRow(Base):
    """A file of the OpenAI face (``/openai/v1/files``): an upload, its bytes in ``openai_file_chunks``; or the
    output or error file of a batch of that face, rendered from its turns when read (no chunks)."""

    __tablename__ = "openai_files"
    __table_args__ = (
        # GET /openai/v1/files: an organisation's files in creation order.
        Index("ix_openai_files_org_created", "org_id", "created_at", "file_id"),
        Index(
            "ix_openai_files_expires",
            "expires_at",
            postgresql_where=text("expires_at IS NOT NULL"),
            sqlite_where=text("expires_at IS NOT NULL"),
        ),
    )

    file_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(128))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(512))
    bytes: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer)
    """Its non-blank lines (an output or error file: its requests)."""
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    """When it is deleted (None: never)."""
    batch_id: Mapped[str | None] = mapped_column(String(64))
    """The batch whose output (``batch_part`` ``output``) or error file (``error``) this is; None for an upload."""
    batch_part: Mapped[str | None] = mapped_column(String(8))


class OpenAIFileChunkRow(Base):
    """One piece of an uploaded file's bytes, in order (``seq`` from 0)."""

    __tablename__ = "openai_file_chunks"

    file_id: Mapped[str] = mapped_column(ForeignKey("openai_files.file_id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class OpenAIBatchRow(Base):
    """A batch of the OpenAI face: what its create request said and how its validation went.

    A valid input file became the Aptix batch of the same id (``batches``, its turns): its progress is
    theirs. An invalid one has no Aptix batch: ``failed_at`` and ``errors`` say why.
    """

    __tablename__ = "openai_batches"
    __table_args__ = (
        UniqueConstraint("org_id", "idempotency_key", name="uq_openai_batches_org_idempotency_key"),
        Index("ix_openai_batches_org_created", "org_id", "created_at", "batch_id"),
        Index(
            "ix_openai_batches_jobs",
            "job_lease_until",
            postgresql_where=text("finished_at IS NULL AND failed_at IS NULL"),
            sqlite_where=text("finished_at IS NULL AND failed_at IS NULL"),
        ),
    )

    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[str] = mapped_column(String(128))
    input_file_id: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    client_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    output_expires_seconds: Mapped[int | None] = mapped_column(Integer)
    """``output_expires_after.seconds``: its output and error files expire this long after they are made."""
    webhook_url: Mapped[str | None] = mapped_column(String(2048))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Its requests (known once validated)."""
    errors: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    """Validation: ``[{line, code, message, param}]`` of the bad lines (the batch failed)."""
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    in_progress_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]
    """When its window ran out with requests unfinished (they were cancelled then)."""
    finished_at: Mapped[datetime | None]
    """When its output and error files were written (it is ``completed``, ``cancelled`` or ``expired`` from then)."""
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    ended_at: Mapped[datetime | None]
    """When its last request ended (noted by the first reader or sweep that saw it): ``finalizing`` until
    ``finished_at``."""
    cancel_requested_at: Mapped[datetime | None]
    """When it was cancelled while ``validating`` (a cancel later on is its Aptix batch's)."""
    job_token: Mapped[str | None] = mapped_column(String(32))
    """Who holds its job (validating it, or writing its files once it ended): a token of the gateway's thread."""
    job_lease_until: Mapped[datetime | None]
    """Until when that holder's lease runs; any gateway may take the job up after it (None: not held yet)."""
    job_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times its job was taken up."""
    completed_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The lines of its output file, once written (its ``request_counts.completed`` from then on)."""
    failed_count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The lines of its error file, once written (its ``request_counts.failed`` from then on)."""


class ToolRunRow(Base):
    """One server tool call's durable record: "started" before the handler runs, its outcome after.

    A call found started without an outcome is not run again unless its tool is idempotent.
    """

    __tablename__ = "tool_runs"

    turn_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    """started, succeeded, failed or unknown (started, and its worker stopped before the outcome)."""
    output: Mapped[str | None] = mapped_column(Text)
    """What the model is told: the tool's output, or the error."""
    worker: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]


PENDING_DELIVERY_SQL = "status = 'pending'"
"""Deliveries still to attempt: the predicate of ``ix_webhook_deliveries_due``."""


class WebhookDeliveryRow(Base):
    """One webhook event and its delivery to one endpoint: written in the transaction of what raised it
    (a turn's commit, its cancel, its batch's last turn), then attempted until delivered or given up."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("event_key", name="uq_webhook_deliveries_event_key"),
        # The sweep: deliveries due (never attempted, or waiting for their next retry).
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text(PENDING_DELIVERY_SQL),
            sqlite_where=text(PENDING_DELIVERY_SQL),
        ),
        # GET /v1/webhook-endpoints: the URLs an organisation's events went to.
        Index("ix_webhook_deliveries_org_url", "org_id", "url"),
    )

    delivery_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """The event's id: the ``webhook-id`` header of every attempt."""
    event_key: Mapped[str] = mapped_column(String(255))
    """What raised it (``turn:<id>:<round>:<status>``, ``batch:<id>``): one event per key, however often
    the commit that raised it runs."""
    org_id: Mapped[str] = mapped_column(String(128))
    event_type: Mapped[str] = mapped_column(String(64))
    turn_id: Mapped[str | None] = mapped_column(String(64), index=True)
    batch_id: Mapped[str | None] = mapped_column(String(64), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    body: Mapped[str] = mapped_column(Text)
    """The event's JSON, sent byte for byte on every attempt."""
    status: Mapped[str] = mapped_column(String(32))
    """pending, delivered, failed (retries ran out) or endpoint_disabled (the endpoint answered 410)."""
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Attempts begun."""
    next_attempt_at: Mapped[datetime | None]
    """While pending: when the next attempt is due (during an attempt: when it is presumed lost)."""
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class WebhookAttemptRow(Base):
    """One attempt to deliver a webhook: the receiver's status code, or why there was none."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.delivery_id", ondelete="CASCADE"), primary_key=True
    )
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime]
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    """Why there is no status code (timeout, connection refused, address refused), or what it meant."""
    duration_ms: Mapped[float | None] = mapped_column(Float)


class WebhookEndpointRow(Base):
    """An endpoint that answered 410 Gone: later events to it are recorded, not sent."""

    __tablename__ = "webhook_endpoints"

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str] = mapped_column(String(2048), primary_key=True)
    disabled_at: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text)


class WebhookSecretRow(Base):
    """A webhook signing secret of an organisation kept in the database (``aptix webhooks secret``): every
    active one signs each delivery (besides the organisation's ``APTIX_WEBHOOK_SECRETS`` one, if any)."""

    __tablename__ = "webhook_secrets"

    secret_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """``whs_`` and 16 hex digits: how the CLI names it (never the secret)."""
    org_id: Mapped[str] = mapped_column(String(128), index=True)
    secret: Mapped[str] = mapped_column(Text)
    """``whsec_<base64>``, as a receiver configures it (the deliveries are signed with it: it cannot be hashed)."""
    created_at: Mapped[datetime]
    retired_at: Mapped[datetime | None]
    """When it stopped signing (None: it signs)."""


class OrgSettingsRow(Base):
    """An organisation's own limits (``aptix orgs set``); a limit left None is the default (or none)."""

    __tablename__ = "org_settings"

    org_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    max_in_flight: Mapped[int | None] = mapped_column(Integer)
    """Its batch turns in flight at once (None: ``APTIX_ORG_MAX_IN_FLIGHT``)."""
    rpm: Mapped[int | None] = mapped_column(Integer)
    """Requests per minute its keys may make, every gateway together (None: no limit)."""
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    """Tokens (input + output) its turns created in one UTC day may use before new turns are refused (None:
    no limit)."""
    updated_at: Mapped[datetime]


class ApiKeyRow(Base):
    """An API key of an organisation (``aptix keys``): its hash, never the key (``shared.api_keys``)."""

    __tablename__ = "api_keys"
    __table_args__ = (
        UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        # aptix keys list --org: an organisation's keys in creation order.
        Index("ix_api_keys_org_created", "org_id", "created_at"),
        # A gateway's refresh: the keys changed since the version it saw.
        Index("ix_api_keys_version", "version"),
    )

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(String(128))
    name: Mapped[str | None] = mapped_column(String(255))
    prefix: Mapped[str] = mapped_column(String(32))
    """The key's first characters (``aptix_`` and 8 digits), to tell keys apart in a listing."""
    key_hash: Mapped[str] = mapped_column(String(64))
    """The key's SHA-256 in hexadecimal: what a gateway looks a presented key up by."""
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
    """When a gateway last verified the key for a request (written at most once a verification interval)."""
    version: Mapped[int] = mapped_column(BigInteger)
    """The ``api_key_version`` this row was created or last revoked at."""


class ApiKeyVersionRow(Base):
    """One row: bumped, in the same transaction, by every change to ``api_keys``; gateways poll it."""

    __tablename__ = "api_key_version"

    singleton: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    """Always 1."""
    version: Mapped[int] = mapped_column(BigInteger)
