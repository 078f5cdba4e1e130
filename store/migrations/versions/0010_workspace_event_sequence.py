"""Gap-free, commit-ordered per-workspace activity event sequence (SCALE-1).

Revision ID: 0010_workspace_event_sequence
Revises: 0009_tool_call_repair
Create Date: 2026-12-03

Appends used to take one ``pg_advisory_xact_lock`` for the whole log so that ids committed in
id order; with several Host replicas that lock serialized every workspace's writers. Each
appender now bumps its workspace's ``workspace_event_heads`` row and stamps its events with the
gap-free ``activity_events.workspace_seq`` it got (ADR 0037).

Backfill: every retained event gets its workspace's sequence in id order, starting at 1 (the
pruned prefix is gone and is not numbered); each workspace's head row is its highest sequence;
``activity_event_retention.pruned_through_seq`` starts at 0, since the numbering starts after
what was pruned. The retention table's incremental count (``counted_through_event_id``,
``retained_count``) is dropped: a workspace now retains exactly ``last_seq -
pruned_through_seq`` events, and the count relied on global commit order, which no longer
holds. One ``UPDATE`` with a window function numbers the log (both engines support it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_workspace_event_sequence"
down_revision: str | Sequence[str] | None = "0009_tool_call_repair"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _sqlite_next_id() -> int | None:
    """SQLite: the ``AUTOINCREMENT`` high-water mark of ``activity_events`` (None elsewhere)."""
    if op.get_bind().dialect.name != "sqlite":
        return None
    found = op.get_bind().execute(
        sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'activity_events'")
    )
    return int(found.scalar_one_or_none() or 0)


def _keep_sqlite_next_id(mark: int | None) -> None:
    """Put back the high-water mark the table copy of batch mode forgot (ids never reused)."""
    if mark is None:
        return
    op.get_bind().execute(
        sa.text("UPDATE sqlite_sequence SET seq = MAX(seq, :mark) WHERE name = 'activity_events'"),
        {"mark": mark},
    )
    op.get_bind().execute(
        sa.text(
            "INSERT INTO sqlite_sequence (name, seq) SELECT 'activity_events', :mark"
            " WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'activity_events')"
        ),
        {"mark": mark},
    )


def upgrade() -> None:
    """Upgrade schema."""
    mark = _sqlite_next_id()
    op.create_table(
        "workspace_event_heads",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", name=op.f("pk_workspace_event_heads")),
    )
    with op.batch_alter_table("activity_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("workspace_seq", sa.BigInteger(), nullable=True))
    op.execute(
        "UPDATE activity_events SET workspace_seq = numbered.seq FROM ("
        " SELECT id, ROW_NUMBER() OVER (PARTITION BY workspace_id ORDER BY id) AS seq"
        " FROM activity_events) AS numbered WHERE activity_events.id = numbered.id"
    )
    op.execute(
        "INSERT INTO workspace_event_heads (workspace_id, last_seq)"
        " SELECT workspace_id, MAX(workspace_seq) FROM activity_events GROUP BY workspace_id"
    )
    # SQLite copies the table here: keep it AUTOINCREMENT and keep its high-water mark.
    with op.batch_alter_table(
        "activity_events", schema=None, table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.alter_column("workspace_seq", existing_type=sa.BigInteger(), nullable=False)
        batch_op.create_index(
            "ux_activity_events_workspace_id_workspace_seq",
            ["workspace_id", "workspace_seq"],
            unique=True,
        )
    _keep_sqlite_next_id(mark)
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("pruned_through_seq", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.alter_column("pruned_through_seq", server_default=None)
        batch_op.drop_index("ix_activity_event_retention_counted_through_event_id")
        batch_op.drop_column("retained_count")
        batch_op.drop_column("counted_through_event_id")


def downgrade() -> None:
    """Downgrade schema (the next prune recounts the log from scratch)."""
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "counted_through_event_id", sa.BigInteger(), nullable=False, server_default="0"
            )
        )
        batch_op.add_column(
            sa.Column("retained_count", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.drop_column("pruned_through_seq")
    with op.batch_alter_table("activity_event_retention", schema=None) as batch_op:
        batch_op.alter_column("counted_through_event_id", server_default=None)
        batch_op.alter_column("retained_count", server_default=None)
        batch_op.create_index(
            "ix_activity_event_retention_counted_through_event_id",
            ["counted_through_event_id"],
            unique=False,
        )
    mark = _sqlite_next_id()
    with op.batch_alter_table(
        "activity_events", schema=None, table_kwargs={"sqlite_autoincrement": True}
    ) as batch_op:
        batch_op.drop_index("ux_activity_events_workspace_id_workspace_seq")
        batch_op.drop_column("workspace_seq")
    _keep_sqlite_next_id(mark)
    op.drop_table("workspace_event_heads")
