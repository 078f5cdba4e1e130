"""The one schema of the suite (STORE-1), as SQLAlchemy 2 declarative models.

Every table is workspace-scoped except the maintenance preference and marker tables, which are
deployment-wide. Timestamps are ``BIGINT`` Unix milliseconds (suffix ``_unix_ms``); cursor values
(versions, sequences, event ids) are ``BIGINT``. JSON-valued columns (suffix ``_json``) are stored
as text exactly as the repository encoded them: the store never re-encodes business JSON, so large
integers, key order and byte budgets (HOST-MSG-3) are what the writer measured.

Ownership (ARCH-2): Host writes the canonical tables and the outboxes (``sessions`` …
``resource_cleanup_outbox``); maintenance writes only the ``maintenance_*`` tables; the store-backed
AppCenter and IssueManager services own ``appcenter_*`` and ``issuemanager_*``.

Referential integrity is enforced by the database (STORE-2). ``ON DELETE`` is chosen so that the
only hard delete of canonical data — a purge (HOST-DEL-9/10), which removes whole Session trees in
one transaction — can delete ``sessions`` rows and let the database remove everything they own,
while the database still refuses to orphan a *live* child Session:

* rows owned by one Session (Turns, Messages, Interactions, response operations, runtime commands,
  host operations) cascade from their Session or Turn, so a purge cannot leave orphans behind;
* the parent edge ``sessions → sessions`` is ``NO ACTION``: deleting a parent whose child is not
  deleted in the same statement fails, so a purge must remove a complete tree (in one statement,
  or leaf-first);
* ``messages → turns`` and ``sessions.active_turn_id → turns`` are ``NO ACTION``: a Turn is never
  deleted on its own (edit-retry retracts, it does not delete), so deleting one that a Message or
  the Session still references is a bug the database reports. When a whole Session is deleted, the
  referencing rows go in the same statement and the check passes.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "CONVERSATIONS_SECTION_KEY",
    "DEPLOYMENT_WORKSPACE_KEY",
    "INTERACTION_STATUSES",
    "NAMING_CONVENTION",
    "RESPONSE_OPERATION_STATES",
    "TURN_OUTCOMES",
    "TURN_PHASES",
    "ActivityEvent",
    "ActivityEventRetention",
    "AgentTarget",
    "AppCenterApp",
    "AppCenterArtifact",
    "AppCenterGroup",
    "Base",
    "HostOperation",
    "Interaction",
    "InteractionResponseOperation",
    "IssueManagerIssue",
    "IssueManagerOutput",
    "IssueManagerTopic",
    "MaintenanceCleanupAttempt",
    "MaintenanceMarker",
    "MaintenancePreference",
    "Message",
    "ResourceCleanupOutbox",
    "RuntimeCommandOutbox",
    "Session",
    "Turn",
    "UserProject",
    "WorkspaceEventHead",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Constraint names are deterministic so migrations can address them on every backend.

Composite foreign keys and listing indexes carry explicit short names (a generated name would
exceed Postgres' 63-character identifier limit and be truncated).
"""

CONVERSATIONS_SECTION_KEY = "conversations"
"""The fixed rail section key of Sessions that belong to no user project (HOST-SES-2)."""

TURN_PHASES = ("queued", "running", "awaiting_interaction", "settled")
"""Stored values of the canonical Turn phase (HOST-TURN-5); ``settled`` is terminal."""

TURN_OUTCOMES = ("completed", "failed", "canceled", "interrupted")
"""Stored values of the Turn outcome; set exactly when the phase is ``settled``."""

INTERACTION_STATUSES = ("pending", "resolving", "answered", "superseded", "interrupted")
"""Stored values of the Interaction status (HOST-INT-1)."""

RESPONSE_OPERATION_STATES = ("pending", "resolving", "completed")
"""States of a durable interaction response operation (HOST-INT-3)."""

# Closed runtime-command / host-operation states. Kinds stay open strings.
OUTBOX_STATES = ("pending", "dispatched", "completed", "failed")
HOST_OPERATION_STATES = ("pending", "committed", "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


class Base(DeclarativeBase):
    """Declarative base: the shared ``MetaData`` with its naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        int: BigInteger(),
        str: String(),
        bool: Boolean(),
        bytes: LargeBinary(),
    }


# SQLite only aliases the rowid (and so only autoincrements) for a column typed exactly INTEGER.
_AUTOINCREMENT_ID = BigInteger().with_variant(Integer(), "sqlite")


# ---------------------------------------------------------------------------------------------
# Workspace records: agent targets and user projects
# ---------------------------------------------------------------------------------------------


DEPLOYMENT_WORKSPACE_KEY = "*"
"""``agent_targets.workspace_id`` of deployment-wide targets (ADR 0009, ADR 0012): the same
``"*"`` that grants every workspace to a principal."""


class AgentTarget(Base):
    """A registered agent target (HOST-TGT-1): which runtime a Session launches on.

    Targets are deployment-wide (ADR 0009); they are stored under the reserved workspace key
    :data:`DEPLOYMENT_WORKSPACE_KEY` so the schema keeps room for workspace-private targets.
    """

    __tablename__ = "agent_targets"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    agent_target_id: Mapped[str] = mapped_column(primary_key=True)
    provider: Mapped[str]
    """Open provider vocabulary (CON-6): stored verbatim, never coerced."""
    display_name: Mapped[str] = mapped_column(default="")
    enabled: Mapped[bool] = mapped_column(default=True)
    launch_ref_json: Mapped[str] = mapped_column(Text)
    capabilities_json: Mapped[str] = mapped_column(Text, default="{}")
    subagent_catalog_json: Mapped[str] = mapped_column(Text, default="[]")
    settings_catalog_json: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")
    """The catalog ``UpdateSessionSettings`` validates and normalizes against (HOST-SES-6)."""
    locality: Mapped[str] = mapped_column(default="local", server_default="local")
    """``local`` | ``shared`` | ``remote`` (HOST-SES-7 rejects worktrees for the latter two)."""
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]


class UserProject(Base):
    """A user project (HOST-PROJ-1); its key is a rail section key."""

    __tablename__ = "user_projects"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    project_key: Mapped[str] = mapped_column(primary_key=True)
    label: Mapped[str]
    path: Mapped[str] = mapped_column(Text)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]


# ---------------------------------------------------------------------------------------------
# Canonical entities: Session, Turn, Message, Interaction
# ---------------------------------------------------------------------------------------------


class Session(Base):
    """One agent conversation; a tombstone when ``deleted_at_unix_ms`` is set (HOST-DEL-*).

    The primary key is ``(workspace_id, session_id)``: the same Session id may exist in several
    workspaces (HOST-DEL-11, HOST-CLEAN-1).
    """

    __tablename__ = "sessions"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    parent_session_id: Mapped[str | None]
    root_session_id: Mapped[str]
    """The root of this Session's tree (equal to ``session_id`` for a root Session)."""
    parent_turn_id: Mapped[str | None]
    """The parent's Turn that started this child (no FK: it lives in another Session)."""
    agent_target_id: Mapped[str | None]
    """Not a foreign key: the Session keeps the id it was launched with as history, and
    provider-only historical imports have none (HOST-SES-1)."""
    provider: Mapped[str]
    provider_target_ref: Mapped[str | None] = mapped_column(Text)
    title: Mapped[str] = mapped_column(Text, default="")
    cwd: Mapped[str | None] = mapped_column(Text)
    rail_section_key: Mapped[str]
    """Exact rail membership (HOST-SES-2, HOST-SES-4); not a FK, the conversations key is no
    project and tombstones keep their key."""
    rail_project_path: Mapped[str | None] = mapped_column(Text)
    """Presentation only; never a join or filter identity (HOST-DEL-7)."""
    settings_json: Mapped[str] = mapped_column(Text, default="{}")
    capabilities_json: Mapped[str] = mapped_column(Text, default="{}")
    usage_json: Mapped[str | None] = mapped_column(Text)
    isolation_json: Mapped[str | None] = mapped_column(Text)
    """Worktree isolation ``{mode, worktree_path, branch, base_commit}`` (HOST-SES-7)."""
    import_json: Mapped[str | None] = mapped_column(Text)
    """Import provenance of an imported Session (HOST-IMP-1); null for ordinary Sessions."""
    provider_resume_json: Mapped[str | None] = mapped_column(Text)
    """Provider-private runtime/resume context. Never exposed on the wire (HOST-SES-3)."""
    launch_subagents_json: Mapped[str | None] = mapped_column(Text)
    """The target's subagent catalog as it was when the Session was created: ``@name`` mentions
    resolve against the launch catalog (HOST-MENT-1). Null for imports and older rows."""
    message_version: Mapped[int] = mapped_column(default=0)
    """High-water Message version of this Session (HOST-MSG-2)."""
    next_message_sequence: Mapped[int] = mapped_column(default=1)
    pinned_at_unix_ms: Mapped[int | None]
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]
    active_turn_id: Mapped[str | None]
    """The active Turn; the composite FK makes it a Turn *of this Session* (STORE-2)."""
    # Tombstone (HOST-DEL-3): set together at delete, cleared together at restore.
    deleted_at_unix_ms: Mapped[int | None]
    deletion_generation: Mapped[str | None]
    component_size: Mapped[int | None]
    tombstone_legacy: Mapped[bool] = mapped_column(default=False)
    """A tombstone written by the older lossy implementation: purgeable, never restorable."""

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "parent_session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_sessions_parent",
            # NO ACTION: a parent cannot be deleted while a child outside the same statement
            # remains; purge removes complete trees.
        ),
        ForeignKeyConstraint(
            ["workspace_id", "session_id", "active_turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name="fk_sessions_active_turn",
            # Circular with turns → sessions: created after both tables (ALTER on Postgres,
            # inline on SQLite, which checks references only at write time). MATCH SIMPLE: not
            # checked while active_turn_id is NULL. NO ACTION on delete (see module docstring);
            # SET NULL is impossible here because it would also null workspace_id/session_id.
            use_alter=True,
        ),
        CheckConstraint(
            "(deleted_at_unix_ms IS NULL AND deletion_generation IS NULL"
            " AND component_size IS NULL AND NOT tombstone_legacy)"
            " OR (deleted_at_unix_ms IS NOT NULL AND tombstone_legacy)"
            " OR (deleted_at_unix_ms IS NOT NULL AND deletion_generation IS NOT NULL"
            " AND component_size IS NOT NULL)",
            name="tombstone_consistent",
        ),
        CheckConstraint("component_size IS NULL OR component_size >= 1", name="component_size"),
        CheckConstraint(
            "deleted_at_unix_ms IS NULL OR active_turn_id IS NULL",
            name="tombstone_has_no_active_turn",
        ),
        CheckConstraint(
            "parent_session_id IS NULL OR parent_session_id <> session_id", name="not_own_parent"
        ),
        CheckConstraint("rail_section_key <> ''", name="rail_section_key_present"),
        CheckConstraint(
            "message_version >= 0 AND next_message_sequence >= 1", name="message_cursors"
        ),
    )


class SessionListingCount(Base):
    """How many live root Sessions each listing key holds (HOST-SES-4, ADR 0024).

    One row per (workspace, ``rail_section_key``, ``agent_target_id``, pinned or not); a live
    root Session (not tombstoned, no parent) counts in exactly one row. ``agent_target_id`` is
    ``''`` for Sessions without a target. Database triggers on ``sessions`` (migration
    ``0007_listing_counts``) keep the rows exact in the same transaction as every insert,
    delete and update that changes membership, whatever code path writes the row, so
    ``total_count`` of a section or pinned page is a read of a few rows instead of a count of
    the section. Nothing writes this table directly; rows that drop to 0 stay.
    """

    __tablename__ = "session_listing_counts"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    rail_section_key: Mapped[str] = mapped_column(primary_key=True)
    agent_target_id: Mapped[str] = mapped_column(primary_key=True)
    pinned: Mapped[bool] = mapped_column(primary_key=True)
    live_roots: Mapped[int]


class Turn(Base):
    """One user submission and the agent work it causes (HOST-TURN-*)."""

    __tablename__ = "turns"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    turn_id: Mapped[str] = mapped_column(primary_key=True)
    client_submit_id: Mapped[str | None]
    """Opaque caller idempotency key, unique per (workspace, Session) when set (HOST-TURN-1)."""
    submit_fingerprint: Mapped[str | None]
    """Digest of the submitted content, to tell an identical replay from a conflicting one."""
    phase: Mapped[str]
    outcome: Mapped[str | None]
    origin: Mapped[str]
    delivery: Mapped[str | None]
    mode: Mapped[str | None]
    """Composer mode of the submission (``agent`` | ``plan`` | ``goal``, HOST-MENT-1)."""
    root_turn_id: Mapped[str | None]
    """The Turn of the root Session this Turn ultimately serves (child Sessions' Turns)."""
    version: Mapped[int] = mapped_column(default=1)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]
    started_at_unix_ms: Mapped[int | None]
    settled_at_unix_ms: Mapped[int | None]
    result_message_id: Mapped[str | None]
    """Frozen at settlement (HOST-TURN-6); no FK to avoid a third circular edge."""
    result_resolved_empty: Mapped[bool] = mapped_column(default=False)
    failure_message: Mapped[str | None] = mapped_column(Text)
    retracted_at_unix_ms: Mapped[int | None]
    """Set when edit-retry removes the Turn from effective history (HOST-FORK-1)."""
    deferred_settlement_json: Mapped[str | None] = mapped_column(Text)
    """A root Turn's reported settlement (outcome, failure message, frozen result candidate)
    waiting for its active child Turns (HOST-TURN-6); cleared when the Turn settles."""
    file_changes_json: Mapped[str | None] = mapped_column(Text)
    """The runtime-reported file-change snapshot (HOST-TURN-8), a JSON list of
    ``{path, change, previous_path?}``; frozen at settlement, ``NULL`` when none was reported."""

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_turns_session",
            ondelete="CASCADE",
        ),
        UniqueConstraint("workspace_id", "session_id", "client_submit_id"),
        CheckConstraint(_in("phase", TURN_PHASES), name="phase"),
        CheckConstraint(
            # "outcome IS NOT NULL" keeps the branch from evaluating to NULL, which a CHECK
            # would accept.
            f"(phase = 'settled' AND outcome IS NOT NULL AND {_in('outcome', TURN_OUTCOMES)})"
            " OR (phase <> 'settled' AND outcome IS NULL)",
            name="outcome_iff_settled",
        ),
        CheckConstraint(
            "result_message_id IS NULL OR NOT result_resolved_empty", name="result_exclusive"
        ),
        CheckConstraint("version >= 1", name="version_positive"),
    )


class Message(Base):
    """A durable transcript row (HOST-MSG-1)."""

    __tablename__ = "messages"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    message_id: Mapped[str] = mapped_column(primary_key=True)
    sequence: Mapped[int]
    """Immutable per-Session order."""
    version: Mapped[int]
    """Increases on every change; the Session's ``message_version`` is the high-water mark."""
    turn_id: Mapped[str | None]
    occurred_at_unix_ms: Mapped[int]
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]
    role: Mapped[str]
    kind: Mapped[str]
    payload_json: Mapped[str] = mapped_column(Text)
    user_visible_assistant_response: Mapped[bool | None]
    """Optional: rows stored without it read back unset (HOST-MSG-1)."""
    command: Mapped[str | None] = mapped_column(Text)
    skill_mentions_json: Mapped[str | None] = mapped_column(Text)
    agent_mentions_json: Mapped[str | None] = mapped_column(Text)
    references_json: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_messages_session",
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["workspace_id", "session_id", "turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name="fk_messages_turn",
            # MATCH SIMPLE: a turnless (session-scoped) message is not checked. Because the key
            # includes session_id, a message can only reference a Turn of its own Session.
        ),
        UniqueConstraint("workspace_id", "session_id", "sequence"),
        # Versions come from the Session's message_version counter, so they are unique per
        # Session; paging by ``after_version`` / ``before_version`` relies on it (HOST-MSG-2).
        UniqueConstraint("workspace_id", "session_id", "version"),
        CheckConstraint("sequence >= 1", name="sequence_positive"),
        CheckConstraint("version >= 1", name="version_positive"),
    )


class Interaction(Base):
    """An actionable request to the user, keyed by the full tuple (HOST-INT-1)."""

    __tablename__ = "interactions"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    turn_id: Mapped[str] = mapped_column(primary_key=True)
    request_id: Mapped[str] = mapped_column(primary_key=True)
    kind: Mapped[str]
    status: Mapped[str]
    tool_name: Mapped[str | None]
    input_json: Mapped[str | None] = mapped_column(Text)
    metadata_json: Mapped[str | None] = mapped_column(Text)
    title: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[str | None] = mapped_column(Text)
    options_json: Mapped[str | None] = mapped_column(Text)
    answer_json: Mapped[str | None] = mapped_column(Text)
    actionable: Mapped[bool] = mapped_column(default=True)
    """False for a stale transition stored idempotently on a settled Turn (HOST-INT-2)."""
    version: Mapped[int] = mapped_column(default=1)
    occurred_at_unix_ms: Mapped[int]
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "session_id", "turn_id"],
            ["turns.workspace_id", "turns.session_id", "turns.turn_id"],
            name="fk_interactions_turn",
            ondelete="CASCADE",
        ),
        CheckConstraint(_in("status", INTERACTION_STATUSES), name="status"),
        CheckConstraint("version >= 1", name="version_positive"),
    )


# ---------------------------------------------------------------------------------------------
# Durable operations and outboxes written by Host
# ---------------------------------------------------------------------------------------------


class InteractionResponseOperation(Base):
    """A durable ``SubmitInteractionResponse`` operation (HOST-INT-3)."""

    __tablename__ = "interaction_response_operations"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    operation_id: Mapped[str] = mapped_column(primary_key=True)
    idempotency_key: Mapped[str]
    session_id: Mapped[str]
    turn_id: Mapped[str]
    request_id: Mapped[str]
    request_fingerprint: Mapped[str]
    """Digest of tuple + answer: an identical replay matches, a changed one conflicts."""
    action: Mapped[str]
    option_id: Mapped[str | None]
    answer_json: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str]
    disposition: Mapped[str | None]
    """The runtime's disposition (an Interaction status), set when the operation completes."""
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at_unix_ms: Mapped[int | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]
    completed_at_unix_ms: Mapped[int | None]

    __table_args__ = (
        ForeignKeyConstraint(
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
        UniqueConstraint("workspace_id", "idempotency_key"),
        CheckConstraint(_in("state", RESPONSE_OPERATION_STATES), name="state"),
        CheckConstraint(
            f"disposition IS NULL OR {_in('disposition', INTERACTION_STATUSES)}",
            name="disposition",
        ),
        Index("ix_interaction_response_operations_due", "state", "next_attempt_at_unix_ms"),
    )


class HostOperation(Base):
    """A durable, idempotent Host operation other than an interaction response.

    Fork (HOST-FORK-1), Goal control (HOST-GOAL-1) and plan decisions (HOST-PLAN-1): ``kind`` names
    the operation, ``client_op_id`` is the caller's idempotency key, and ``GetOperation`` reads
    ``state`` / ``result_json``.
    """

    __tablename__ = "host_operations"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    operation_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str]
    kind: Mapped[str]
    client_op_id: Mapped[str]
    request_fingerprint: Mapped[str]
    request_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str]
    checkpoint: Mapped[str | None]
    """Saga step reached (for example ``send_dispatched``); never re-executed blindly."""
    result_json: Mapped[str | None] = mapped_column(Text)
    error_json: Mapped[str | None] = mapped_column(Text)
    lease_owner: Mapped[str | None]
    lease_expires_at_unix_ms: Mapped[int | None]
    version: Mapped[int] = mapped_column(default=1)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_host_operations_session",
            ondelete="CASCADE",
        ),
        UniqueConstraint("workspace_id", "session_id", "kind", "client_op_id"),
        CheckConstraint(_in("state", HOST_OPERATION_STATES), name="state"),
    )


class RuntimeCommandOutbox(Base):
    """Commands to dispatch to agent runtimes, written with the facts that cause them.

    A dispatcher sends ``pending`` rows (retrying with backoff, also after a restart) and marks
    them ``dispatched`` / ``completed`` / ``failed``. ``command_id`` makes dispatch idempotent.
    An acknowledged row is deleted unless an open response operation may still re-dispatch it,
    or it is a rejected ``apply_settings`` its waiter has not read yet (ADR 0013 §10, §11), so
    the table holds open work only.
    """

    __tablename__ = "runtime_command_outbox"

    id: Mapped[int] = mapped_column(_AUTOINCREMENT_ID, primary_key=True, autoincrement=True)
    workspace_id: Mapped[str]
    session_id: Mapped[str]
    command_id: Mapped[str]
    command_kind: Mapped[str]
    operation_id: Mapped[str | None]
    payload_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str]
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at_unix_ms: Mapped[int]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "session_id"],
            ["sessions.workspace_id", "sessions.session_id"],
            name="fk_runtime_command_outbox_session",
            ondelete="CASCADE",
        ),
        UniqueConstraint("workspace_id", "command_id"),
        CheckConstraint(_in("state", OUTBOX_STATES), name="state"),
        Index("ix_runtime_command_outbox_due", "state", "next_attempt_at_unix_ms"),
        # A CommandAck names only the command id; dispatch reads one Session's open rows.
        Index("ix_runtime_command_outbox_command", "command_id"),
        Index("ix_runtime_command_outbox_session", "workspace_id", "session_id", "state"),
        {"sqlite_autoincrement": True},
    )


class ActivityEvent(Base):
    """The durable activity event log behind ``WatchActivity`` (HOST-OBS-1/2).

    ``id`` is the cursor: monotonic and never reused (``AUTOINCREMENT`` on SQLite, an identity
    sequence on Postgres), so trimming old rows cannot hand out an id a consumer already saw.
    ``payload`` is the serialized event. No FK to ``sessions``: events outlive a purge until the
    log is trimmed, and a ``session_deleted`` event must stay readable.

    ``workspace_seq`` is the workspace's gap-free, commit-ordered sequence (SCALE-1): the
    appending transaction draws it from its workspace's :class:`WorkspaceEventHead` row, whose
    lock it holds until it commits, and draws the row ids after it, so within one workspace
    both ``id`` and ``workspace_seq`` increase in commit order (ADR 0037).
    """

    __tablename__ = "activity_events"

    id: Mapped[int] = mapped_column(_AUTOINCREMENT_ID, primary_key=True, autoincrement=True)
    workspace_id: Mapped[str]
    workspace_seq: Mapped[int]
    session_id: Mapped[str | None]
    event_type: Mapped[str]
    payload: Mapped[bytes]
    created_at_unix_ms: Mapped[int]

    __table_args__ = (
        Index("ix_activity_events_workspace_id_id", "workspace_id", "id"),
        Index(
            "ux_activity_events_workspace_id_workspace_seq",
            "workspace_id",
            "workspace_seq",
            unique=True,
        ),
        Index("ix_activity_events_created_at_unix_ms", "created_at_unix_ms"),
        {"sqlite_autoincrement": True},
    )


class ActivityEventRetention(Base):
    """Per-workspace bookkeeping of the activity event log's pruner (HOST-OBS-2, ADR 0015).

    Only the pruner writes it (and only the pruner deletes ``activity_events`` rows).
    ``pruned_through_event_id`` is the highest id of the workspace's events the pruner deleted:
    every event of the workspace with an id up to it is gone, every later one is kept, so a
    cursor below it has expired and one at or above it has not (0: nothing pruned).
    ``pruned_through_seq`` is that event's ``workspace_seq``: the workspace keeps exactly its
    events above it, so it retains ``WorkspaceEventHead.last_seq - pruned_through_seq`` events
    and the size bound costs no count at all (ADR 0037).
    """

    __tablename__ = "activity_event_retention"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    pruned_through_event_id: Mapped[int]
    pruned_through_seq: Mapped[int]


class WorkspaceEventHead(Base):
    """Per workspace, the last ``workspace_seq`` handed out (SCALE-1, ADR 0037).

    Appenders bump it with ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: the row lock that
    takes serializes the appenders of one workspace until they commit, and only them, so the
    sequence is gap-free and commit-ordered without a lock across workspaces. A rolled-back
    append rolls its bump back with it.
    """

    __tablename__ = "workspace_event_heads"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    last_seq: Mapped[int]


class RuntimePresence(Base):
    """Which Host replica a runtime is attached to (SCALE-2, ADR 0042); one row per runtime.

    Written only when Host runs with the shared bus (several replicas). ``replica_id`` is the
    attaching replica (``NULL`` once the link ended); the replica renews
    ``lease_expires_at_unix_ms`` of its rows while it lives, so the row of a replica that died
    (``kill -9``) stops counting when its lease runs out. ``instance_id`` outlives the link, so a
    runtime that comes back as a new instance on another replica is recognised as restarted.
    """

    __tablename__ = "runtime_presence"

    runtime_id: Mapped[str] = mapped_column(primary_key=True)
    instance_id: Mapped[str]
    replica_id: Mapped[str | None]
    link_id: Mapped[str | None]
    identity_json: Mapped[str] = mapped_column(Text)
    attached_at_unix_ms: Mapped[int]
    lease_expires_at_unix_ms: Mapped[int]
    detached_at_unix_ms: Mapped[int | None]

    __table_args__ = (Index("ix_runtime_presence_replica", "replica_id"),)


class ResourceCleanupOutbox(Base):
    """One row per purged (workspace, Session), written in the purge transaction (HOST-DEL-9).

    A pending row for a Session id fences creating a Session with that id in every workspace
    (HOST-DEL-11) until maintenance completes it (HOST-CLEAN-1, MAINT-OUT-1).
    """

    __tablename__ = "resource_cleanup_outbox"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    purged_at_unix_ms: Mapped[int]
    reason: Mapped[str]

    __table_args__ = (
        Index("ix_resource_cleanup_outbox_session_id", "session_id"),
        Index("ix_resource_cleanup_outbox_purged_at_unix_ms", "purged_at_unix_ms"),
    )


# ---------------------------------------------------------------------------------------------
# Maintenance-owned tables (ARCH-2: preference, markers, attempt counts)
# ---------------------------------------------------------------------------------------------


class MaintenancePreference(Base):
    """Deployment-wide maintenance preferences, e.g. ``retention_days`` (MAINT-PREF-1)."""

    __tablename__ = "maintenance_preferences"

    key: Mapped[str] = mapped_column(primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at_unix_ms: Mapped[int]


class MaintenanceMarker(Base):
    """Durable completion markers, e.g. the daily automatic run (MAINT-SCHED-1)."""

    __tablename__ = "maintenance_markers"

    name: Mapped[str] = mapped_column(primary_key=True)
    completed_at_unix_ms: Mapped[int]


class MaintenanceCleanupAttempt(Base):
    """Attempts and backoff of one resource-cleanup outbox row (MAINT-OUT-1).

    No FK to ``resource_cleanup_outbox``: that table is Host's, read only through Host RPCs.
    """

    __tablename__ = "maintenance_cleanup_attempts"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(primary_key=True)
    attempts: Mapped[int] = mapped_column(default=0)
    next_attempt_at_unix_ms: Mapped[int]
    last_error: Mapped[str | None] = mapped_column(Text)
    updated_at_unix_ms: Mapped[int]

    __table_args__ = (
        Index("ix_maintenance_cleanup_attempts_next_attempt_at_unix_ms", "next_attempt_at_unix_ms"),
    )


# ---------------------------------------------------------------------------------------------
# Store-backed AppCenter and IssueManager backends (REF-BACKEND-1)
# ---------------------------------------------------------------------------------------------


class AppCenterApp(Base):
    """An app whose artifacts can be referenced (REF-APP-1)."""

    __tablename__ = "appcenter_apps"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    app_id: Mapped[str] = mapped_column(primary_key=True)
    name: Mapped[str]
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]


class AppCenterGroup(Base):
    """A nested artifact group of one app; ``parent_group_id`` is null at the app's top level."""

    __tablename__ = "appcenter_groups"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    group_id: Mapped[str] = mapped_column(primary_key=True)
    app_id: Mapped[str]
    parent_group_id: Mapped[str | None]
    name: Mapped[str]
    position: Mapped[int] = mapped_column(default=0)
    created_at_unix_ms: Mapped[int]

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "app_id"],
            ["appcenter_apps.workspace_id", "appcenter_apps.app_id"],
            name="fk_appcenter_groups_app",
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["workspace_id", "parent_group_id"],
            ["appcenter_groups.workspace_id", "appcenter_groups.group_id"],
            name="fk_appcenter_groups_parent",
            ondelete="CASCADE",
        ),
        Index("ix_appcenter_groups_app", "workspace_id", "app_id", "parent_group_id"),
    )


class AppCenterArtifact(Base):
    """A file an app produced; the reference result item shape (REF-API-1)."""

    __tablename__ = "appcenter_artifacts"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    artifact_id: Mapped[str] = mapped_column(primary_key=True)
    app_id: Mapped[str]
    group_id: Mapped[str | None]
    path: Mapped[str] = mapped_column(Text)
    display_name: Mapped[str]
    size_bytes: Mapped[int]
    media_type: Mapped[str]
    created_at_unix_ms: Mapped[int]
    position: Mapped[int] = mapped_column(default=0)

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "app_id"],
            ["appcenter_apps.workspace_id", "appcenter_apps.app_id"],
            name="fk_appcenter_artifacts_app",
            ondelete="CASCADE",
        ),
        ForeignKeyConstraint(
            ["workspace_id", "group_id"],
            ["appcenter_groups.workspace_id", "appcenter_groups.group_id"],
            name="fk_appcenter_artifacts_group",
            ondelete="CASCADE",
        ),
        Index("ix_appcenter_artifacts_group", "workspace_id", "app_id", "group_id"),
    )


class IssueManagerTopic(Base):
    """A topic that groups issues (REF-TASK-1)."""

    __tablename__ = "issuemanager_topics"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    topic_id: Mapped[str] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(Text)
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]


class IssueManagerIssue(Base):
    """An issue (task) in a topic; ``detail`` may contain reference mentions (REF-EXP-1)."""

    __tablename__ = "issuemanager_issues"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    issue_id: Mapped[str] = mapped_column(primary_key=True)
    topic_id: Mapped[str]
    title: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(default="open")
    created_at_unix_ms: Mapped[int]
    updated_at_unix_ms: Mapped[int]

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "topic_id"],
            ["issuemanager_topics.workspace_id", "issuemanager_topics.topic_id"],
            name="fk_issuemanager_issues_topic",
            ondelete="CASCADE",
        ),
        Index("ix_issuemanager_issues_topic", "workspace_id", "topic_id"),
    )


class IssueManagerOutput(Base):
    """A file an issue produced; ``is_latest`` marks the issue's current outputs (REF-TASK-1)."""

    __tablename__ = "issuemanager_outputs"

    workspace_id: Mapped[str] = mapped_column(primary_key=True)
    output_id: Mapped[str] = mapped_column(primary_key=True)
    issue_id: Mapped[str]
    path: Mapped[str] = mapped_column(Text)
    display_name: Mapped[str]
    size_bytes: Mapped[int]
    media_type: Mapped[str]
    created_at_unix_ms: Mapped[int]
    is_latest: Mapped[bool] = mapped_column(default=True)

    __table_args__ = (
        ForeignKeyConstraint(
            ["workspace_id", "issue_id"],
            ["issuemanager_issues.workspace_id", "issuemanager_issues.issue_id"],
            name="fk_issuemanager_outputs_issue",
            ondelete="CASCADE",
        ),
        Index("ix_issuemanager_outputs_issue", "workspace_id", "issue_id", "is_latest"),
    )


# ---------------------------------------------------------------------------------------------
# Indexes that need column expressions (DESC) or partial predicates
# ---------------------------------------------------------------------------------------------

_LIVE = text("deleted_at_unix_ms IS NULL")
_TOMBSTONE = text("deleted_at_unix_ms IS NOT NULL")

# HOST-SES-4: section pages, search and pinned pages over live Sessions, ordered
# ``updated_at DESC, session_id ASC``.
Index(
    "ix_sessions_live_section",
    Session.workspace_id,
    Session.rail_section_key,
    Session.updated_at_unix_ms.desc(),
    Session.session_id,
    sqlite_where=_LIVE,
    postgresql_where=_LIVE,
)
Index(
    "ix_sessions_live_updated",
    Session.workspace_id,
    Session.updated_at_unix_ms.desc(),
    Session.session_id,
    sqlite_where=_LIVE,
    postgresql_where=_LIVE,
)
# HOST-SES-4: a section's first page and the pinned page read a page's worth of live *root*
# entries in page order (0007). The predicates name every visibility term of the listing query,
# so no filter is left to evaluate row by row and a section full of pinned or child Sessions
# costs nothing (ADR 0024).
_UNPINNED_ROOT = text(
    "deleted_at_unix_ms IS NULL AND parent_session_id IS NULL AND pinned_at_unix_ms IS NULL"
)
_PINNED_ROOT = text(
    "deleted_at_unix_ms IS NULL AND parent_session_id IS NULL AND pinned_at_unix_ms IS NOT NULL"
)
Index(
    "ix_sessions_unpinned_roots",
    Session.workspace_id,
    Session.rail_section_key,
    Session.updated_at_unix_ms.desc(),
    Session.session_id,
    sqlite_where=_UNPINNED_ROOT,
    postgresql_where=_UNPINNED_ROOT,
)
Index(
    "ix_sessions_pinned_roots",
    Session.workspace_id,
    Session.updated_at_unix_ms.desc(),
    Session.session_id,
    sqlite_where=_PINNED_ROOT,
    postgresql_where=_PINNED_ROOT,
)
# Tree walks (delete closure, purge trees, child Sessions).
Index("ix_sessions_parent", Session.workspace_id, Session.parent_session_id)
Index("ix_sessions_root", Session.workspace_id, Session.root_session_id)
# HOST-DEL-11 / HOST-CLEAN-1: does any workspace own this Session id?
Index("ix_sessions_session_id", Session.session_id)
# HOST-DEL-7/9/10: tombstone listing and purge scans by cutoff.
Index(
    "ix_sessions_tombstones",
    Session.workspace_id,
    Session.deleted_at_unix_ms,
    sqlite_where=_TOMBSTONE,
    postgresql_where=_TOMBSTONE,
)
# HOST-DEL-7: the deleted-session listing, ``updated_at DESC, session_id ASC`` (0004).
Index(
    "ix_sessions_tombstone_listing",
    Session.workspace_id,
    Session.updated_at_unix_ms.desc(),
    Session.session_id,
    sqlite_where=_TOMBSTONE,
    postgresql_where=_TOMBSTONE,
)
Index(
    "ix_sessions_tombstones_by_age",
    Session.deleted_at_unix_ms,
    sqlite_where=_TOMBSTONE,
    postgresql_where=_TOMBSTONE,
)
# HOST-ACT-1: is any Turn active (overall / per workspace)?
Index(
    "ix_sessions_active_turn",
    Session.workspace_id,
    Session.active_turn_id,
    sqlite_where=text("active_turn_id IS NOT NULL"),
    postgresql_where=text("active_turn_id IS NOT NULL"),
)
# Turn listing per Session; Messages of a Turn.
Index("ix_turns_session_created", Turn.workspace_id, Turn.session_id, Turn.created_at_unix_ms)
Index("ix_messages_turn", Message.workspace_id, Message.session_id, Message.turn_id)
# HOST-SES-8: a section's most recently settled Turns that carry a file-change snapshot, read
# per live Session of the section in settlement order (0008).
_SETTLED_WITH_SNAPSHOT = text("phase = 'settled' AND file_changes_json IS NOT NULL")
Index(
    "ix_turns_settled_file_changes",
    Turn.workspace_id,
    Turn.session_id,
    Turn.settled_at_unix_ms.desc(),
    Turn.turn_id,
    sqlite_where=_SETTLED_WITH_SNAPSHOT,
    postgresql_where=_SETTLED_WITH_SNAPSHOT,
)
# HOST-INT-4: pending Interactions of a workspace.
Index("ix_interactions_status", Interaction.workspace_id, Interaction.status)
