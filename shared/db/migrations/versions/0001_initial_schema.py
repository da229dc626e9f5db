"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 18:20:53.423360
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_snapshots",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("turn_id"),
    )
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("mode", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id"),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sessions_org_id"), ["org_id"], unique=False)

    op.create_table(
        "transcript_items",
        sa.Column("item_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("item_id"),
        sa.UniqueConstraint("turn_id", "seq", name="uq_transcript_turn_seq"),
    )
    with op.batch_alter_table("transcript_items", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_transcript_items_session_id"), ["session_id"], unique=False)

    op.create_table(
        "turns",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("new_session", sa.Boolean(), nullable=False),
        sa.Column("requested_mode", sa.String(length=64), nullable=True),
        sa.Column("mode", sa.String(length=64), nullable=True),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("output_text", sa.Text(), nullable=True),
        sa.Column("pending_tool_calls", sa.JSON(), nullable=False),
        sa.Column("mode_changes", sa.JSON(), nullable=False),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("usage", sa.JSON(), nullable=False),
        sa.Column("trace", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("turn_id"),
        sa.UniqueConstraint("org_id", "idempotency_key", name="uq_turns_org_idempotency_key"),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_turns_batch_id"), ["batch_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_turns_org_id"), ["org_id"], unique=False)
        batch_op.create_index("ix_turns_session_created", ["session_id", "created_at"], unique=False)
        batch_op.create_index(
            "uq_turns_one_unfinished_per_session",
            ["session_id"],
            unique=True,
            postgresql_where=sa.text("status IN ('queued', 'running', 'requires_client_tools')"),
            sqlite_where=sa.text("status IN ('queued', 'running', 'requires_client_tools')"),
        )

    op.create_table(
        "mode_history",
        sa.Column("history_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("from_mode", sa.String(length=64), nullable=True),
        sa.Column("to_mode", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.session_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("history_id"),
        sa.UniqueConstraint("turn_id", "seq", name="uq_mode_history_turn_seq"),
    )
    with op.batch_alter_table("mode_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_mode_history_session_id"), ["session_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("mode_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_mode_history_session_id"))

    op.drop_table("mode_history")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_turns_one_unfinished_per_session",
            postgresql_where=sa.text("status IN ('queued', 'running', 'requires_client_tools')"),
            sqlite_where=sa.text("status IN ('queued', 'running', 'requires_client_tools')"),
        )
        batch_op.drop_index("ix_turns_session_created")
        batch_op.drop_index(batch_op.f("ix_turns_org_id"))
        batch_op.drop_index(batch_op.f("ix_turns_batch_id"))

    op.drop_table("turns")
    with op.batch_alter_table("transcript_items", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_transcript_items_session_id"))

    op.drop_table("transcript_items")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sessions_org_id"))

    op.drop_table("sessions")
    op.drop_table("provider_snapshots")
