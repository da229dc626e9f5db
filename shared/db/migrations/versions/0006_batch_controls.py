"""batch controls: idempotency keys, cancel requests, reused turns, and the per-organisation listing index

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("reused", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("cancel_mode", sa.String(length=16), nullable=True))
        batch_op.create_unique_constraint("uq_batches_org_idempotency_key", ["org_id", "idempotency_key"])
        batch_op.create_index("ix_batches_org_created", ["org_id", "created_at", "batch_id"], unique=False)
    op.create_table(
        "batch_reused_turns",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("batch_index", sa.Integer(), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.batch_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id", "batch_index"),
    )


def downgrade() -> None:
    op.drop_table("batch_reused_turns")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index("ix_batches_org_created")
        batch_op.drop_constraint("uq_batches_org_idempotency_key", type_="unique")
        batch_op.drop_column("cancel_mode")
        batch_op.drop_column("cancel_requested_at")
        batch_op.drop_column("reused")
        batch_op.drop_column("request_hash")
        batch_op.drop_column("idempotency_key")
