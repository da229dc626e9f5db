"""the OpenAI face's files (their bytes in chunks) and batches

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "openai_files",
        sa.Column("file_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=512), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.Column("batch_part", sa.String(length=8), nullable=True),
        sa.PrimaryKeyConstraint("file_id"),
    )
    op.create_index("ix_openai_files_org_created", "openai_files", ["org_id", "created_at", "file_id"])
    op.create_index(
        "ix_openai_files_expires",
        "openai_files",
        ["expires_at"],
        postgresql_where=sa.text("expires_at IS NOT NULL"),
        sqlite_where=sa.text("expires_at IS NOT NULL"),
    )
    op.create_table(
        "openai_file_chunks",
        sa.Column("file_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["file_id"], ["openai_files.file_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("file_id", "seq"),
    )
    op.create_table(
        "openai_batches",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("input_file_id", sa.String(length=64), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("completion_window", sa.String(length=16), nullable=False),
        sa.Column("client_metadata", sa.JSON(), nullable=True),
        sa.Column("output_expires_seconds", sa.Integer(), nullable=True),
        sa.Column("webhook_url", sa.String(length=2048), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("total", sa.Integer(), server_default="0", nullable=False),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("in_progress_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("output_file_id", sa.String(length=64), nullable=True),
        sa.Column("error_file_id", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("batch_id"),
        sa.UniqueConstraint("org_id", "idempotency_key", name="uq_openai_batches_org_idempotency_key"),
    )
    op.create_index("ix_openai_batches_org_created", "openai_batches", ["org_id", "created_at", "batch_id"])


def downgrade() -> None:
    op.drop_index("ix_openai_batches_org_created", table_name="openai_batches")
    op.drop_table("openai_batches")
    op.drop_table("openai_file_chunks")
    op.drop_index("ix_openai_files_expires", table_name="openai_files")
    op.drop_index("ix_openai_files_org_created", table_name="openai_files")
    op.drop_table("openai_files")
