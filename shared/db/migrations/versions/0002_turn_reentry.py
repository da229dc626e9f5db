"""turn re-entry: the round counter and the posted client tool results

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("round", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("client_tool_results", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("client_tool_results")
        batch_op.drop_column("round")
