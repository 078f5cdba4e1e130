"""Runtime presence across Host replicas (SCALE-2).

Revision ID: 0011_runtime_presence
Revises: 0010_workspace_event_sequence
Create Date: 2026-12-04

A runtime may attach to any Host replica. ``runtime_presence`` records, per runtime, the
replica that holds its link, the identity its hello declared (providers, targets, workspaces,
capabilities) and a lease the replica renews while it lives; ``instance_id`` stays after the
link ends, so a restart is recognised on whichever replica the runtime returns to (ADR 0042).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_runtime_presence"
down_revision: str | Sequence[str] | None = "0010_workspace_event_sequence"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "runtime_presence",
        sa.Column("runtime_id", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=False),
        sa.Column("replica_id", sa.String(), nullable=True),
        sa.Column("link_id", sa.String(), nullable=True),
        sa.Column("identity_json", sa.Text(), nullable=False),
        sa.Column("attached_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("lease_expires_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("detached_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("runtime_id", name=op.f("pk_runtime_presence")),
    )
    op.create_index("ix_runtime_presence_replica", "runtime_presence", ["replica_id"], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_runtime_presence_replica", table_name="runtime_presence")
    op.drop_table("runtime_presence")
