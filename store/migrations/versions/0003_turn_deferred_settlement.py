"""A root Turn's settlement deferred until its child Turns settle (HOST-TURN-6).

Revision ID: 0003_turn_deferred_settlement
Revises: 0002_agent_target_catalogs
Create Date: 2026-11-30

``turns`` gains ``deferred_settlement_json``: when a runtime reports a root Turn's terminal
patch while child Turns (``root_turn_id`` = that Turn) are still active, Host records the
reported outcome, failure message and the frozen result candidate here and keeps the Turn
active; the last child's settlement settles the root with the recorded values and clears
the column. Existing rows have nothing deferred. See ADR 0013.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_turn_deferred_settlement"
down_revision: str | Sequence[str] | None = "0002_agent_target_catalogs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deferred_settlement_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_column("deferred_settlement_json")
