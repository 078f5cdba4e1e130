"""Alembic environment of the canonical store, shipped in the package (see ``store.migrate``)."""
