"""Agent target settings catalog and locality; the launch subagent catalog of a Session.

Revision ID: 0002_agent_target_catalogs
Revises: 0001_initial
Create Date: 2026-11-30

``agent_targets`` gains the settings catalog ``UpdateSessionSettings`` validates against
(HOST-SES-6) and the target's locality (HOST-SES-7). ``sessions`` gains the subagent catalog the
Session was launched with (HOST-MENT-1 reads the *launch* catalog, not the target's current one).
Existing rows get an empty catalog, ``local`` and no launch catalog. See ADR 0012.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_agent_target_catalogs"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("agent_targets", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("settings_catalog_json", sa.Text(), server_default="{}", nullable=False)
        )
        batch_op.add_column(
            sa.Column("locality", sa.String(), server_default="local", nullable=False)
        )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("launch_subagents_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_column("launch_subagents_json")
    with op.batch_alter_table("agent_targets", schema=None) as batch_op:
        batch_op.drop_column("locality")
        batch_op.drop_column("settings_catalog_json")
