"""A Turn's file-change snapshot and the index of SearchGeneratedFiles (HOST-TURN-8, HOST-SES-8).

Revision ID: 0008_turn_file_changes
Revises: 0007_listing_counts
Create Date: 2026-12-03

``turns`` gains ``file_changes_json``: the file-change snapshot the runtime reports on its Turn
patches (a JSON list of ``{path, change, previous_path?}``), frozen at settlement. Existing rows
stay ``NULL`` (read as an empty list): Turns settled before this contract are never backfilled.

``ix_turns_settled_file_changes`` holds only settled Turns that carry a snapshot, per Session in
settlement order, so ``SearchGeneratedFiles`` reads each live Session of a section (through
``ix_sessions_live_section``) with one bounded index range and never touches Turns without one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_turn_file_changes"
down_revision: str | Sequence[str] | None = "0007_listing_counts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SETTLED_WITH_SNAPSHOT = sa.text("phase = 'settled' AND file_changes_json IS NOT NULL")


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("file_changes_json", sa.Text(), nullable=True))
    op.create_index(
        "ix_turns_settled_file_changes",
        "turns",
        ["workspace_id", "session_id", sa.text("settled_at_unix_ms DESC"), "turn_id"],
        unique=False,
        sqlite_where=_SETTLED_WITH_SNAPSHOT,
        postgresql_where=_SETTLED_WITH_SNAPSHOT,
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(
        "ix_turns_settled_file_changes",
        table_name="turns",
        sqlite_where=_SETTLED_WITH_SNAPSHOT,
        postgresql_where=_SETTLED_WITH_SNAPSHOT,
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("file_changes_json")
