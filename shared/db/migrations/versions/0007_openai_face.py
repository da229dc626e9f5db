"""the OpenAI face: responses (one per round of a turn), paused rounds of a turn, session metadata

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("response_id", sa.String(length=80), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("previous_response_id", sa.String(length=80), nullable=True),
        sa.Column("conversation_id", sa.String(length=80), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("response_id"),
        sa.UniqueConstraint("org_id", "idempotency_key", name="uq_responses_org_idempotency_key"),
        sa.UniqueConstraint("turn_id", "round", name="uq_responses_turn_round"),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("paused_rounds", sa.JSON(), server_default="[]", nullable=False))
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_metadata", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("client_metadata")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("paused_rounds")
    op.drop_table("responses")
