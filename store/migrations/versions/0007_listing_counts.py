"""Maintained live-root counts and root-only page indexes of the Session listings (HOST-SES-4).

Revision ID: 0007_listing_counts
Revises: 0006_activity_event_retention
Create Date: 2026-12-02

A section page's ``total_count`` was a ``count(*)`` of the whole filtered section, so the first
page cost grew with the section (ADR 0024). ``session_listing_counts`` holds, per (workspace,
``rail_section_key``, ``agent_target_id`` or ``''``, pinned), the number of live root Sessions;
row-level triggers on ``sessions`` keep it exact in the same transaction as every change of
membership (insert, delete, and an update of ``deleted_at_unix_ms``, ``parent_session_id``,
``rail_section_key``, ``agent_target_id`` or ``pinned_at_unix_ms``), whichever code writes the
row. Each trigger looks at its own row's old and new values only, so the count stays exact
however a statement orders its rows (Postgres runs ``AFTER`` row triggers at the end of the
statement). The table is filled from the existing rows here.

``ix_sessions_unpinned_roots`` and ``ix_sessions_pinned_roots`` serve a section page and the
pinned page in page order with every visibility term in the index predicate.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_listing_counts"
down_revision: str | Sequence[str] | None = "0006_activity_event_retention"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNPINNED_ROOT = sa.text(
    "deleted_at_unix_ms IS NULL AND parent_session_id IS NULL AND pinned_at_unix_ms IS NULL"
)
_PINNED_ROOT = sa.text(
    "deleted_at_unix_ms IS NULL AND parent_session_id IS NULL AND pinned_at_unix_ms IS NOT NULL"
)

# The columns whose change can move a row in or out of a count, or between counts.
_MEMBERSHIP_COLUMNS = (
    "deleted_at_unix_ms, parent_session_id, rail_section_key, agent_target_id, pinned_at_unix_ms"
)
_CHANGED = (
    "OLD.deleted_at_unix_ms IS DISTINCT FROM NEW.deleted_at_unix_ms"
    " OR OLD.parent_session_id IS DISTINCT FROM NEW.parent_session_id"
    " OR OLD.rail_section_key IS DISTINCT FROM NEW.rail_section_key"
    " OR OLD.agent_target_id IS DISTINCT FROM NEW.agent_target_id"
    " OR OLD.pinned_at_unix_ms IS DISTINCT FROM NEW.pinned_at_unix_ms"
)


def _counted(row: str) -> str:
    return f"{row}.deleted_at_unix_ms IS NULL AND {row}.parent_session_id IS NULL"


def _key_match(row: str, pinned: str) -> str:
    return (
        f"workspace_id = {row}.workspace_id AND rail_section_key = {row}.rail_section_key"
        f" AND agent_target_id = COALESCE({row}.agent_target_id, '')"
        f" AND pinned = {pinned}"
    )


_INSERT_COLUMNS = "workspace_id, rail_section_key, agent_target_id, pinned, live_roots"
_CONFLICT = "ON CONFLICT (workspace_id, rail_section_key, agent_target_id, pinned)"

# SQLite: booleans are 0/1 and ``IS NOT`` is its ``IS DISTINCT FROM``.
_SQLITE_PINNED = "({row}.pinned_at_unix_ms IS NOT NULL)"


def _sqlite_increment(row: str) -> str:
    pinned = _SQLITE_PINNED.format(row=row)
    # ``WHERE`` after the SELECT also settles SQLite's parsing ambiguity of ``ON CONFLICT``.
    return (
        f"INSERT INTO session_listing_counts ({_INSERT_COLUMNS})"
        f" SELECT {row}.workspace_id, {row}.rail_section_key,"
        f" COALESCE({row}.agent_target_id, ''), {pinned}, 1 WHERE {_counted(row)}"
        f" {_CONFLICT} DO UPDATE SET live_roots = live_roots + 1;"
    )


def _sqlite_decrement(row: str) -> str:
    pinned = _SQLITE_PINNED.format(row=row)
    return (
        "UPDATE session_listing_counts SET live_roots = live_roots - 1"
        f" WHERE {_key_match(row, pinned)} AND {_counted(row)};"
    )


_SQLITE_TRIGGERS = (
    "CREATE TRIGGER trg_sessions_listing_count_insert AFTER INSERT ON sessions"
    f" WHEN {_counted('NEW')} BEGIN {_sqlite_increment('NEW')} END",
    "CREATE TRIGGER trg_sessions_listing_count_delete AFTER DELETE ON sessions"
    f" WHEN {_counted('OLD')} BEGIN {_sqlite_decrement('OLD')} END",
    f"CREATE TRIGGER trg_sessions_listing_count_update AFTER UPDATE OF {_MEMBERSHIP_COLUMNS}"
    f" ON sessions WHEN {_CHANGED.replace('IS DISTINCT FROM', 'IS NOT')}"
    f" BEGIN {_sqlite_decrement('OLD')} {_sqlite_increment('NEW')} END",
)

_POSTGRES_FUNCTION = f"""
CREATE FUNCTION session_listing_count_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND {_counted("OLD")} THEN
        UPDATE session_listing_counts SET live_roots = live_roots - 1
        WHERE {_key_match("OLD", "(OLD.pinned_at_unix_ms IS NOT NULL)")};
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') AND {_counted("NEW")} THEN
        INSERT INTO session_listing_counts ({_INSERT_COLUMNS})
        VALUES (NEW.workspace_id, NEW.rail_section_key, COALESCE(NEW.agent_target_id, ''),
                NEW.pinned_at_unix_ms IS NOT NULL, 1)
        {_CONFLICT} DO UPDATE SET live_roots = session_listing_counts.live_roots + 1;
    END IF;
    RETURN NULL;
END
$$
"""

_POSTGRES_TRIGGERS = (
    "CREATE TRIGGER trg_sessions_listing_count_insert AFTER INSERT ON sessions"
    f" FOR EACH ROW WHEN ({_counted('NEW')}) EXECUTE FUNCTION session_listing_count_apply()",
    "CREATE TRIGGER trg_sessions_listing_count_delete AFTER DELETE ON sessions"
    f" FOR EACH ROW WHEN ({_counted('OLD')}) EXECUTE FUNCTION session_listing_count_apply()",
    f"CREATE TRIGGER trg_sessions_listing_count_update AFTER UPDATE OF {_MEMBERSHIP_COLUMNS}"
    f" ON sessions FOR EACH ROW WHEN ({_CHANGED})"
    " EXECUTE FUNCTION session_listing_count_apply()",
)

_TRIGGER_NAMES = (
    "trg_sessions_listing_count_insert",
    "trg_sessions_listing_count_delete",
    "trg_sessions_listing_count_update",
)

_BACKFILL = (
    f"INSERT INTO session_listing_counts ({_INSERT_COLUMNS})"
    " SELECT workspace_id, rail_section_key, COALESCE(agent_target_id, ''),"
    " pinned_at_unix_ms IS NOT NULL, count(*) FROM sessions"
    " WHERE deleted_at_unix_ms IS NULL AND parent_session_id IS NULL"
    " GROUP BY workspace_id, rail_section_key, COALESCE(agent_target_id, ''),"
    " pinned_at_unix_ms IS NOT NULL"
)


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "session_listing_counts",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("rail_section_key", sa.String(), nullable=False),
        sa.Column("agent_target_id", sa.String(), nullable=False),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("live_roots", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "workspace_id",
            "rail_section_key",
            "agent_target_id",
            "pinned",
            name=op.f("pk_session_listing_counts"),
        ),
    )
    op.create_index(
        "ix_sessions_unpinned_roots",
        "sessions",
        ["workspace_id", "rail_section_key", sa.text("updated_at_unix_ms DESC"), "session_id"],
        unique=False,
        sqlite_where=_UNPINNED_ROOT,
        postgresql_where=_UNPINNED_ROOT,
    )
    op.create_index(
        "ix_sessions_pinned_roots",
        "sessions",
        ["workspace_id", sa.text("updated_at_unix_ms DESC"), "session_id"],
        unique=False,
        sqlite_where=_PINNED_ROOT,
        postgresql_where=_PINNED_ROOT,
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(sa.text(_POSTGRES_FUNCTION))
        triggers = _POSTGRES_TRIGGERS
    else:
        triggers = _SQLITE_TRIGGERS
    for statement in triggers:
        op.execute(sa.text(statement))
    # After the triggers, in the same transaction: no write can fall between the two.
    op.execute(sa.text(_BACKFILL))


def downgrade() -> None:
    """Downgrade schema."""
    postgres = op.get_bind().dialect.name == "postgresql"
    for name in _TRIGGER_NAMES:
        op.execute(
            sa.text(f"DROP TRIGGER {name} ON sessions" if postgres else f"DROP TRIGGER {name}")
        )
    if postgres:
        op.execute(sa.text("DROP FUNCTION session_listing_count_apply()"))
    op.drop_index(
        "ix_sessions_pinned_roots",
        table_name="sessions",
        sqlite_where=_PINNED_ROOT,
        postgresql_where=_PINNED_ROOT,
    )
    op.drop_index(
        "ix_sessions_unpinned_roots",
        table_name="sessions",
        sqlite_where=_UNPINNED_ROOT,
        postgresql_where=_UNPINNED_ROOT,
    )
    op.drop_table("session_listing_counts")
