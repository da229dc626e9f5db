"""per-organisation limits, webhook secrets kept in the database, and the indexes of usage and endpoints

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "org_settings",
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("max_in_flight", sa.Integer(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("org_id"),
    )
    op.create_table(
        "webhook_secrets",
        sa.Column("secret_id", sa.String(length=64), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("secret_id"),
    )
    op.create_index("ix_webhook_secrets_org_id", "webhook_secrets", ["org_id"])
    op.create_index("ix_turns_org_created", "turns", ["org_id", "created_at"])
    op.create_index("ix_webhook_deliveries_org_url", "webhook_deliveries", ["org_id", "url"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_org_url", table_name="webhook_deliveries")
    op.drop_index("ix_turns_org_created", table_name="turns")
    op.drop_index("ix_webhook_secrets_org_id", table_name="webhook_secrets")
    op.drop_table("webhook_secrets")
    op.drop_table("org_settings")
