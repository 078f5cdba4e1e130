"""Initial schema: the complete canonical store, outboxes, maintenance and backend tables.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29

``sessions.active_turn_id`` and ``turns → sessions`` reference each other. On Postgres the
active-turn foreign key is added with ``ALTER TABLE`` once both tables exist (and dropped first on
downgrade); SQLite cannot add a constraint to an existing table but checks references only at
write time, so there it is declared inline in ``CREATE TABLE sessions``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_ACTIVE_TURN_FK = "fk_sessions_active_turn"


def _is_sqlite() -> bool:
    return op.get_context().dialect.name == "sqlite"


def _inline_active_turn_fk() -> list[sa.ForeignKeyConstraint]:
    """The circular active-turn FK, inline on SQLite only (see the module docstring)."""
    if not _is_sqlite():
        return []
    # MATCH SIMPLE (the default on both backends): unchecked while active_turn_id is NULL.
    return [
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id", "active_turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name=_ACTIVE_TURN_FK,
        )
    ]


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "activity_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=True),
        sa.Column("event_type", sa.String(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_activity_events")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("activity_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_activity_events_created_at_unix_ms", ["created_at_unix_ms"], unique=False
        )
        batch_op.create_index(
            "ix_activity_events_workspace_id_id", ["workspace_id", "id"], unique=False
        )

    op.create_table(
        "agent_targets",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("agent_target_id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("display_name", sa.String(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("launch_ref_json", sa.Text(), nullable=False),
        sa.Column("capabilities_json", sa.Text(), nullable=False),
        sa.Column("subagent_catalog_json", sa.Text(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "agent_target_id", name=op.f("pk_agent_targets")),
    )
    op.create_table(
        "appcenter_apps",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("app_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "app_id", name=op.f("pk_appcenter_apps")),
    )
    op.create_table(
        "issuemanager_topics",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("topic_id", sa.String(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "topic_id", name=op.f("pk_issuemanager_topics")),
    )
    op.create_table(
        "maintenance_cleanup_attempts",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.Column("next_attempt_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "workspace_id", "session_id", name=op.f("pk_maintenance_cleanup_attempts")
        ),
    )
    with op.batch_alter_table("maintenance_cleanup_attempts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_maintenance_cleanup_attempts_next_attempt_at_unix_ms",
            ["next_attempt_at_unix_ms"],
            unique=False,
        )

    op.create_table(
        "maintenance_markers",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("completed_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_maintenance_markers")),
    )
    op.create_table(
        "maintenance_preferences",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_maintenance_preferences")),
    )
    op.create_table(
        "resource_cleanup_outbox",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("purged_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint(
            "workspace_id", "session_id", name=op.f("pk_resource_cleanup_outbox")
        ),
    )
    with op.batch_alter_table("resource_cleanup_outbox", schema=None) as batch_op:
        batch_op.create_index(
            "ix_resource_cleanup_outbox_purged_at_unix_ms", ["purged_at_unix_ms"], unique=False
        )
        batch_op.create_index("ix_resource_cleanup_outbox_session_id", ["session_id"], unique=False)

    op.create_table(
        "sessions",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("parent_session_id", sa.String(), nullable=True),
        sa.Column("root_session_id", sa.String(), nullable=False),
        sa.Column("parent_turn_id", sa.String(), nullable=True),
        sa.Column("agent_target_id", sa.String(), nullable=True),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("provider_target_ref", sa.Text(), nullable=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("rail_section_key", sa.String(), nullable=False),
        sa.Column("rail_project_path", sa.Text(), nullable=True),
        sa.Column("settings_json", sa.Text(), nullable=False),
        sa.Column("capabilities_json", sa.Text(), nullable=False),
        sa.Column("usage_json", sa.Text(), nullable=True),
        sa.Column("isolation_json", sa.Text(), nullable=True),
        sa.Column("import_json", sa.Text(), nullable=True),
        sa.Column("provider_resume_json", sa.Text(), nullable=True),
        sa.Column("message_version", sa.BigInteger(), nullable=False),
        sa.Column("next_message_sequence", sa.BigInteger(), nullable=False),
        sa.Column("pinned_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("active_turn_id", sa.String(), nullable=True),
        sa.Column("deleted_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("deletion_generation", sa.String(), nullable=True),
        sa.Column("component_size", sa.BigInteger(), nullable=True),
        sa.Column("tombstone_legacy", sa.Boolean(), nullable=False),
        sa.CheckConstraint(
            "rail_section_key <> ''", name=op.f("ck_sessions_rail_section_key_present")
        ),
        sa.CheckConstraint(
            "(deleted_at_unix_ms IS NULL AND deletion_generation IS NULL AND component_size IS NULL AND NOT tombstone_legacy) OR (deleted_at_unix_ms IS NOT NULL AND tombstone_legacy) OR (deleted_at_unix_ms IS NOT NULL AND deletion_generation IS NOT NULL AND component_size IS NOT NULL)",
            name=op.f("ck_sessions_tombstone_consistent"),
        ),
        sa.CheckConstraint(
            "component_size IS NULL OR component_size >= 1", name=op.f("ck_sessions_component_size")
        ),
        sa.CheckConstraint(
            "deleted_at_unix_ms IS NULL OR active_turn_id IS NULL",
            name=op.f("ck_sessions_tombstone_has_no_active_turn"),
        ),
        sa.CheckConstraint(
            "message_version >= 0 AND next_message_sequence >= 1",
            name=op.f("ck_sessions_message_cursors"),
        ),
        sa.CheckConstraint(
            "parent_session_id IS NULL OR parent_session_id <> session_id",
            name=op.f("ck_sessions_not_own_parent"),
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "parent_session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_sessions_parent",
        ),
        *_inline_active_turn_fk(),
        sa.PrimaryKeyConstraint("workspace_id", "session_id", name=op.f("pk_sessions")),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_sessions_active_turn",
            ["workspace_id", "active_turn_id"],
            unique=False,
            sqlite_where=sa.text("active_turn_id IS NOT NULL"),
            postgresql_where=sa.text("active_turn_id IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_sessions_live_section",
            [
                "workspace_id",
                "rail_section_key",
                sa.literal_column("updated_at_unix_ms DESC"),
                "session_id",
            ],
            unique=False,
            sqlite_where=sa.text("deleted_at_unix_ms IS NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NULL"),
        )
        batch_op.create_index(
            "ix_sessions_live_updated",
            ["workspace_id", sa.literal_column("updated_at_unix_ms DESC"), "session_id"],
            unique=False,
            sqlite_where=sa.text("deleted_at_unix_ms IS NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NULL"),
        )
        batch_op.create_index(
            "ix_sessions_parent", ["workspace_id", "parent_session_id"], unique=False
        )
        batch_op.create_index("ix_sessions_root", ["workspace_id", "root_session_id"], unique=False)
        batch_op.create_index("ix_sessions_session_id", ["session_id"], unique=False)
        batch_op.create_index(
            "ix_sessions_tombstones",
            ["workspace_id", "deleted_at_unix_ms"],
            unique=False,
            sqlite_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_sessions_tombstones_by_age",
            ["deleted_at_unix_ms"],
            unique=False,
            sqlite_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
        )

    op.create_table(
        "user_projects",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("project_key", sa.String(), nullable=False),
        sa.Column("label", sa.String(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workspace_id", "project_key", name=op.f("pk_user_projects")),
    )
    op.create_table(
        "appcenter_groups",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("group_id", sa.String(), nullable=False),
        sa.Column("app_id", sa.String(), nullable=False),
        sa.Column("parent_group_id", sa.String(), nullable=True),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id", "app_id"],
            ["appcenter_apps.workspace_id", "appcenter_apps.app_id"],
            name="fk_appcenter_groups_app",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "parent_group_id"],
            ["appcenter_groups.workspace_id", "appcenter_groups.group_id"],
            name="fk_appcenter_groups_parent",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "group_id", name=op.f("pk_appcenter_groups")),
    )
    with op.batch_alter_table("appcenter_groups", schema=None) as batch_op:
        batch_op.create_index(
            "ix_appcenter_groups_app", ["workspace_id", "app_id", "parent_group_id"], unique=False
        )

    op.create_table(
        "host_operations",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("operation_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("client_op_id", sa.String(), nullable=False),
        sa.Column("request_fingerprint", sa.String(), nullable=False),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("checkpoint", sa.String(), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("error_json", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_expires_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "state IN ('pending', 'committed', 'failed')", name=op.f("ck_host_operations_state")
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_host_operations_session",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "operation_id", name=op.f("pk_host_operations")),
        sa.UniqueConstraint(
            "workspace_id",
            "session_id",
            "kind",
            "client_op_id",
            name=op.f("uq_host_operations_workspace_id_session_id_kind_client_op_id"),
        ),
    )
    op.create_table(
        "issuemanager_issues",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("issue_id", sa.String(), nullable=False),
        sa.Column("topic_id", sa.String(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id", "topic_id"],
            ["issuemanager_topics.workspace_id", "issuemanager_topics.topic_id"],
            name="fk_issuemanager_issues_topic",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "issue_id", name=op.f("pk_issuemanager_issues")),
    )
    with op.batch_alter_table("issuemanager_issues", schema=None) as batch_op:
        batch_op.create_index(
            "ix_issuemanager_issues_topic", ["workspace_id", "topic_id"], unique=False
        )

    op.create_table(
        "runtime_command_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("command_id", sa.String(), nullable=False),
        sa.Column("command_kind", sa.String(), nullable=False),
        sa.Column("operation_id", sa.String(), nullable=True),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.Column("next_attempt_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "state IN ('pending', 'dispatched', 'completed', 'failed')",
            name=op.f("ck_runtime_command_outbox_state"),
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_runtime_command_outbox_session",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_command_outbox")),
        sa.UniqueConstraint(
            "workspace_id",
            "command_id",
            name=op.f("uq_runtime_command_outbox_workspace_id_command_id"),
        ),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("runtime_command_outbox", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runtime_command_outbox_due", ["state", "next_attempt_at_unix_ms"], unique=False
        )

    op.create_table(
        "turns",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("client_submit_id", sa.String(), nullable=True),
        sa.Column("submit_fingerprint", sa.String(), nullable=True),
        sa.Column("phase", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=True),
        sa.Column("origin", sa.String(), nullable=False),
        sa.Column("delivery", sa.String(), nullable=True),
        sa.Column("mode", sa.String(), nullable=True),
        sa.Column("root_turn_id", sa.String(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("started_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("settled_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("result_message_id", sa.String(), nullable=True),
        sa.Column("result_resolved_empty", sa.Boolean(), nullable=False),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("retracted_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "(phase = 'settled' AND outcome IS NOT NULL AND outcome IN ('completed', 'failed', 'canceled', 'interrupted')) OR (phase <> 'settled' AND outcome IS NULL)",
            name=op.f("ck_turns_outcome_iff_settled"),
        ),
        sa.CheckConstraint(
            "phase IN ('queued', 'running', 'awaiting_interaction', 'settled')",
            name=op.f("ck_turns_phase"),
        ),
        sa.CheckConstraint(
            "result_message_id IS NULL OR NOT result_resolved_empty",
            name=op.f("ck_turns_result_exclusive"),
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_turns_version_positive")),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_turns_session",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "session_id", "turn_id", name=op.f("pk_turns")),
        sa.UniqueConstraint(
            "workspace_id",
            "session_id",
            "client_submit_id",
            name=op.f("uq_turns_workspace_id_session_id_client_submit_id"),
        ),
    )
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.create_index(
            "ix_turns_session_created",
            ["workspace_id", "session_id", "created_at_unix_ms"],
            unique=False,
        )

    if not _is_sqlite():
        op.create_foreign_key(
            _ACTIVE_TURN_FK,
            "sessions",
            "turns",
            ["workspace_id", "session_id", "active_turn_id"],
            ["workspace_id", "session_id", "turn_id"],
        )

    op.create_table(
        "appcenter_artifacts",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("artifact_id", sa.String(), nullable=False),
        sa.Column("app_id", sa.String(), nullable=False),
        sa.Column("group_id", sa.String(), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("display_name", sa.String(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id", "app_id"],
            ["appcenter_apps.workspace_id", "appcenter_apps.app_id"],
            name="fk_appcenter_artifacts_app",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "group_id"],
            ["appcenter_groups.workspace_id", "appcenter_groups.group_id"],
            name="fk_appcenter_artifacts_group",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "artifact_id", name=op.f("pk_appcenter_artifacts")),
    )
    with op.batch_alter_table("appcenter_artifacts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_appcenter_artifacts_group", ["workspace_id", "app_id", "group_id"], unique=False
        )

    op.create_table(
        "interactions",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("tool_name", sa.String(), nullable=True),
        sa.Column("input_json", sa.Text(), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("options_json", sa.Text(), nullable=True),
        sa.Column("answer_json", sa.Text(), nullable=True),
        sa.Column("actionable", sa.Boolean(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("occurred_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'resolving', 'answered', 'superseded', 'interrupted')",
            name=op.f("ck_interactions_status"),
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_interactions_version_positive")),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id", "turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name="fk_interactions_turn",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "workspace_id", "session_id", "turn_id", "request_id", name=op.f("pk_interactions")
        ),
    )
    with op.batch_alter_table("interactions", schema=None) as batch_op:
        batch_op.create_index("ix_interactions_status", ["workspace_id", "status"], unique=False)

    op.create_table(
        "issuemanager_outputs",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("output_id", sa.String(), nullable=False),
        sa.Column("issue_id", sa.String(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("display_name", sa.String(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("media_type", sa.String(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("is_latest", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id", "issue_id"],
            ["issuemanager_issues.workspace_id", "issuemanager_issues.issue_id"],
            name="fk_issuemanager_outputs_issue",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "output_id", name=op.f("pk_issuemanager_outputs")),
    )
    with op.batch_alter_table("issuemanager_outputs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_issuemanager_outputs_issue", ["workspace_id", "issue_id", "is_latest"], unique=False
        )

    op.create_table(
        "messages",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("message_id", sa.String(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=True),
        sa.Column("occurred_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("user_visible_assistant_response", sa.Boolean(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("skill_mentions_json", sa.Text(), nullable=True),
        sa.Column("agent_mentions_json", sa.Text(), nullable=True),
        sa.Column("references_json", sa.Text(), nullable=True),
        sa.CheckConstraint("sequence >= 1", name=op.f("ck_messages_sequence_positive")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_messages_version_positive")),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id", "turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name="fk_messages_turn",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_messages_session",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "workspace_id", "session_id", "message_id", name=op.f("pk_messages")
        ),
        sa.UniqueConstraint(
            "workspace_id",
            "session_id",
            "sequence",
            name=op.f("uq_messages_workspace_id_session_id_sequence"),
        ),
        sa.UniqueConstraint(
            "workspace_id",
            "session_id",
            "version",
            name=op.f("uq_messages_workspace_id_session_id_version"),
        ),
    )
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(
            "ix_messages_turn", ["workspace_id", "session_id", "turn_id"], unique=False
        )

    op.create_table(
        "interaction_response_operations",
        sa.Column("workspace_id", sa.String(), nullable=False),
        sa.Column("operation_id", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("turn_id", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("request_fingerprint", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("option_id", sa.String(), nullable=True),
        sa.Column("answer_json", sa.Text(), nullable=True),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("disposition", sa.String(), nullable=True),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.Column("next_attempt_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_at_unix_ms", sa.BigInteger(), nullable=False),
        sa.Column("completed_at_unix_ms", sa.BigInteger(), nullable=True),
        sa.CheckConstraint(
            "disposition IS NULL OR disposition IN ('pending', 'resolving', 'answered', 'superseded', 'interrupted')",
            name=op.f("ck_interaction_response_operations_disposition"),
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'resolving', 'completed')",
            name=op.f("ck_interaction_response_operations_state"),
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id", "session_id", "turn_id", "request_id"],
            [
                "interactions.workspace_id",
                "interactions.session_id",
                "interactions.turn_id",
                "interactions.request_id",
            ],
            name="fk_interaction_response_operations_interaction",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "workspace_id", "operation_id", name=op.f("pk_interaction_response_operations")
        ),
        sa.UniqueConstraint(
            "workspace_id",
            "idempotency_key",
            name=op.f("uq_interaction_response_operations_workspace_id_idempotency_key"),
        ),
    )
    with op.batch_alter_table("interaction_response_operations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_interaction_response_operations_due",
            ["state", "next_attempt_at_unix_ms"],
            unique=False,
        )


def downgrade() -> None:
    """Downgrade schema."""
    if not _is_sqlite():
        op.drop_constraint(_ACTIVE_TURN_FK, "sessions", type_="foreignkey")
    with op.batch_alter_table("interaction_response_operations", schema=None) as batch_op:
        batch_op.drop_index("ix_interaction_response_operations_due")

    op.drop_table("interaction_response_operations")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_turn")

    op.drop_table("messages")
    with op.batch_alter_table("issuemanager_outputs", schema=None) as batch_op:
        batch_op.drop_index("ix_issuemanager_outputs_issue")

    op.drop_table("issuemanager_outputs")
    with op.batch_alter_table("interactions", schema=None) as batch_op:
        batch_op.drop_index("ix_interactions_status")

    op.drop_table("interactions")
    with op.batch_alter_table("appcenter_artifacts", schema=None) as batch_op:
        batch_op.drop_index("ix_appcenter_artifacts_group")

    op.drop_table("appcenter_artifacts")
    with op.batch_alter_table("turns", schema=None) as batch_op:
        batch_op.drop_index("ix_turns_session_created")

    op.drop_table("turns")
    with op.batch_alter_table("runtime_command_outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_runtime_command_outbox_due")

    op.drop_table("runtime_command_outbox")
    with op.batch_alter_table("issuemanager_issues", schema=None) as batch_op:
        batch_op.drop_index("ix_issuemanager_issues_topic")

    op.drop_table("issuemanager_issues")
    op.drop_table("host_operations")
    with op.batch_alter_table("appcenter_groups", schema=None) as batch_op:
        batch_op.drop_index("ix_appcenter_groups_app")

    op.drop_table("appcenter_groups")
    op.drop_table("user_projects")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_sessions_tombstones_by_age",
            sqlite_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_sessions_tombstones",
            sqlite_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NOT NULL"),
        )
        batch_op.drop_index("ix_sessions_session_id")
        batch_op.drop_index("ix_sessions_root")
        batch_op.drop_index("ix_sessions_parent")
        batch_op.drop_index(
            "ix_sessions_live_updated",
            sqlite_where=sa.text("deleted_at_unix_ms IS NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NULL"),
        )
        batch_op.drop_index(
            "ix_sessions_live_section",
            sqlite_where=sa.text("deleted_at_unix_ms IS NULL"),
            postgresql_where=sa.text("deleted_at_unix_ms IS NULL"),
        )
        batch_op.drop_index(
            "ix_sessions_active_turn",
            sqlite_where=sa.text("active_turn_id IS NOT NULL"),
            postgresql_where=sa.text("active_turn_id IS NOT NULL"),
        )

    op.drop_table("sessions")
    with op.batch_alter_table("resource_cleanup_outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_resource_cleanup_outbox_session_id")
        batch_op.drop_index("ix_resource_cleanup_outbox_purged_at_unix_ms")

    op.drop_table("resource_cleanup_outbox")
    op.drop_table("maintenance_preferences")
    op.drop_table("maintenance_markers")
    with op.batch_alter_table("maintenance_cleanup_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_maintenance_cleanup_attempts_next_attempt_at_unix_ms")

    op.drop_table("maintenance_cleanup_attempts")
    op.drop_table("issuemanager_topics")
    op.drop_table("appcenter_apps")
    op.drop_table("agent_targets")
    with op.batch_alter_table("activity_events", schema=None) as batch_op:
        batch_op.drop_index("ix_activity_events_workspace_id_id")
        batch_op.drop_index("ix_activity_events_created_at_unix_ms")

    op.drop_table("activity_events")
