"""Per-workspace retention of the activity event log (HOST-OBS-2).

Revision ID: 0006_activity_event_retention
Revises: 0005_runtime_outbox_lookups
Create Date: 2026-12-05

The pruner used to trim the log globally by id, so a busy workspace's traffic expired a quiet
workspace's cursors. It now keeps each workspace's newest ``activity_event_max_rows`` events
younger than ``activity_event_retention_seconds`` (and always each workspace's newest event).
``activity_event_retention`` holds, per workspace, the highest event id the pruner deleted (the
exact cursor-expiry bound ``WatchActivity`` checks) and how many retained events it has counted
so far (so the size bound never scans the whole log). The per-workspace statements use
``ix_activity_events_workspace_id_id`` ``(workspace_id, id)``, which exists since
``0001_initial_schema``. The table starts empty: the first prune counts the log once. See
ADR 0015.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_activity_event_retention"
down_revision: str | Sequence[str] | None = "0005_runtime_outbox_lookups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "activity_event_retention",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("pruned_through_event_id", sa.BigInteger(), nullable=False),
        sa.Column("counted_through_event_id", sa.BigInteger(), nullable=False),
        sa.Column("retained_count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", name=op.f("pk_activity_event_retention")),
    )
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.create_index(
            "ix_activity_event_retention_counted_through_event_id",
            ["counted_through_event_id"],
            unique=False,
        )


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.drop_index("ix_activity_event_retention_counted_through_event_id")
    op.drop_table("activity_event_retention")
