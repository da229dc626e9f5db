"""webhooks: deliveries, their attempts, disabled endpoints, and each batch's webhook URL

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("webhook_url", sa.String(length=2048), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("delivery_id", sa.String(length=64), nullable=False),
        sa.Column("event_key", sa.String(length=255), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=True),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("delivery_id"),
        sa.UniqueConstraint("event_key", name="uq_webhook_deliveries_event_key"),
    )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhook_deliveries_turn_id"), ["turn_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_webhook_deliveries_batch_id"), ["batch_id"], unique=False)
        batch_op.create_index(
            "ix_webhook_deliveries_due",
            ["next_attempt_at"],
            unique=False,
            postgresql_where=_PENDING,
            sqlite_where=_PENDING,
        )
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.delivery_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("delivery_id", "attempt"),
    )
    op.create_table(
        "webhook_endpoints",
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("org_id", "url"),
    )


def downgrade() -> None:
    op.drop_table("webhook_endpoints")
    op.drop_table("webhook_attempts")
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_deliveries_due", postgresql_where=_PENDING, sqlite_where=_PENDING)
        batch_op.drop_index(batch_op.f("ix_webhook_deliveries_batch_id"))
        batch_op.drop_index(batch_op.f("ix_webhook_deliveries_turn_id"))
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("webhook_url")
