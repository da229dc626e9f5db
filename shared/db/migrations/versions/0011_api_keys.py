"""API keys in the database (``aptix keys``) and the version counter gateways poll

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_org_created", "api_keys", ["org_id", "created_at"])
    op.create_index("ix_api_keys_version", "api_keys", ["version"])
    op.create_table(
        "api_key_version",
        sa.Column("singleton", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("singleton"),
    )
    op.execute("INSERT INTO api_key_version (singleton, version) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("api_key_version")
    op.drop_index("ix_api_keys_version", table_name="api_keys")
    op.drop_index("ix_api_keys_org_created", table_name="api_keys")
    op.drop_table("api_keys")
