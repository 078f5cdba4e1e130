"""Alembic revisions of the canonical store, oldest first."""
