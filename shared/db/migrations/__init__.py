"""Alembic migrations of the durable store."""
