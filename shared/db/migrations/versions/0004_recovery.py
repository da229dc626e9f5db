"""recovery: each in-flight turn's deadline and re-drive count, durable server tool runs

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_IN_FLIGHT = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("redrives", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index(
            "ix_turns_in_flight_deadline",
            ["deadline_at"],
            unique=False,
            postgresql_where=_IN_FLIGHT,
            sqlite_where=_IN_FLIGHT,
        )
    # Turns already in flight are due at once: the reconciler looks at each after the upgrade.
    op.execute("UPDATE turns SET deadline_at = updated_at WHERE status IN ('queued', 'running')")
    op.create_table(
        "tool_runs",
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("turn_id", "call_id"),
    )


def downgrade() -> None:
    op.drop_table("tool_runs")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index("ix_turns_in_flight_deadline", postgresql_where=_IN_FLIGHT, sqlite_where=_IN_FLIGHT)
        batch_op.drop_column("redrives")
        batch_op.drop_column("deadline_at")
