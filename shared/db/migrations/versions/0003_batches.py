"""batches, and each turn's position in its batch

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("batch_id"),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_batches_org_id"), ["org_id"], unique=False)
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("batch_index")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batches_org_id"))
    op.drop_table("batches")
