"""Indexes of the runtime command outbox lookups (HOST-RT-1).

Revision ID: 0005_runtime_outbox_lookups
Revises: 0004_tombstone_listing_index
Create Date: 2026-12-03

A runtime's ``CommandAck`` carries only the ``command_id``, and dispatching a Session's
commands reads that Session's unacknowledged rows. The only indexes were
``(workspace_id, command_id)`` and ``(state, next_attempt_at_unix_ms)``, so the
acknowledgement scanned the whole table and the dispatch read every unacknowledged row of
the workspace — both inside write transactions. ``ix_runtime_command_outbox_command``
serves the acknowledgement, ``ix_runtime_command_outbox_session`` the per-Session dispatch,
the Session delete's settlement of unacknowledged commands and the purge's cascade.
Acknowledged rows are deleted from now on (ADR 0013), so the table holds only open work;
this revision deletes the completed rows no response operation can re-dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_runtime_outbox_lookups"
down_revision: str | Sequence[str] | None = "0004_tombstone_listing_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_index(
        "ix_runtime_command_outbox_command", "runtime_command_outbox", ["command_id"], unique=False
    )
    op.create_index(
        "ix_runtime_command_outbox_session",
        "runtime_command_outbox",
        ["workspace_id", "session_id", "state"],
        unique=False,
    )
    # Rows acknowledged before this revision: completed commands no response operation can
    # re-dispatch are what the Host now deletes at acknowledgement.
    op.execute(
        sa.text(
            "DELETE FROM runtime_command_outbox WHERE state = 'completed' AND operation_id IS NULL"
        )
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index("ix_runtime_command_outbox_session", table_name="runtime_command_outbox")
    op.drop_index("ix_runtime_command_outbox_command", table_name="runtime_command_outbox")
