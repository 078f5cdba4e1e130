"""Index of the deleted-session listing (HOST-DEL-7).

Revision ID: 0004_tombstone_listing_index
Revises: 0003_turn_deferred_settlement
Create Date: 2026-12-02

``ListDeletedSessions`` pages a workspace's tombstones ``updated_at DESC, session_id ASC``.
The partial index ``ix_sessions_tombstone_listing`` (tombstones only) serves that order
directly, so the first page reads a page's worth of index entries instead of sorting every
tombstone of the workspace. See ADR 0016.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_tombstone_listing_index"
down_revision: str | Sequence[str] | None = "0003_turn_deferred_settlement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOMBSTONE = sa.text("deleted_at_unix_ms IS NOT NULL")


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index(
        "ix_sessions_tombstone_listing",
        "sessions",
        ["workspace_id", sa.text("updated_at_unix_ms DESC"), "session_id"],
        unique=False,
        sqlite_where=_TOMBSTONE,
        postgresql_where=_TOMBSTONE,
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(
        "ix_sessions_tombstone_listing",
        table_name="sessions",
        sqlite_where=_TOMBSTONE,
        postgresql_where=_TOMBSTONE,
    )
