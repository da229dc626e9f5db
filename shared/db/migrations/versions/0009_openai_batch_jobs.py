"""the OpenAI face's batch jobs: a lease on validating a batch or writing its files; its end, its cancel while
validating and what its files hold

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("openai_batches", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("openai_batches", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("openai_batches", sa.Column("job_token", sa.String(length=32), nullable=True))
    op.add_column("openai_batches", sa.Column("job_lease_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("openai_batches", sa.Column("job_attempts", sa.Integer(), server_default="0", nullable=False))
    op.add_column("openai_batches", sa.Column("completed_count", sa.Integer(), server_default="0", nullable=False))
    op.add_column("openai_batches", sa.Column("failed_count", sa.Integer(), server_default="0", nullable=False))
    op.create_index(
        "ix_openai_batches_jobs",
        "openai_batches",
        ["job_lease_until"],
        postgresql_where=sa.text("finished_at IS NULL AND failed_at IS NULL"),
        sqlite_where=sa.text("finished_at IS NULL AND failed_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_openai_batches_jobs", table_name="openai_batches")
    for name in (
        "failed_count",
        "completed_count",
        "job_attempts",
        "job_lease_until",
        "job_token",
        "cancel_requested_at",
        "ended_at",
    ):
        op.drop_column("openai_batches", name)
