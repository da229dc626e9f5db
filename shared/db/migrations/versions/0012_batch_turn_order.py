"""a batch's turns in request order, and its turns still moving: ix_turns_batch_order on (batch_id, batch_index)
replaces ix_turns_batch_id; ix_turns_batch_in_flight on batch_id, for turns queued or running

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_IN_FLIGHT = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    # Each page of a batch's turns (BatchRepository.turns) is a range of this index: batch_index > the last one.
    op.create_index("ix_turns_batch_order", "turns", ["batch_id", "batch_index"], unique=False)
    op.drop_index("ix_turns_batch_id", table_name="turns")  # its prefix: every lookup by batch_id uses the new one
    # "Has the batch a turn still moving?" (OpenAIBatchRepository.ended_unnoted): one probe of a small index.
    op.create_index(
        "ix_turns_batch_in_flight",
        "turns",
        ["batch_id"],
        unique=False,
        postgresql_where=_IN_FLIGHT,
        sqlite_where=_IN_FLIGHT,
    )


def downgrade() -> None:
    op.drop_index("ix_turns_batch_in_flight", table_name="turns", postgresql_where=_IN_FLIGHT, sqlite_where=_IN_FLIGHT)
    op.create_index("ix_turns_batch_id", "turns", ["batch_id"], unique=False)
    op.drop_index("ix_turns_batch_order", table_name="turns")
