"""Session lifecycle commands and the canonical Session read (HOST-SES-1/2/3/5/6, HOST-LANE-1).

Every command that mutates one Session runs inside that Session's mutation lane
(``ctx.lanes.hold``), commits in one transaction, and answers with the Session read back
from the store after the commit, so a response is always persisted truth. The lane is
per process; inside the transaction each command also locks the Session row (root first,
``lock_with_root``), so its read-check-write cannot interleave with the same command on
another Host replica (SCALE-1, ADR 0037).

``CreateSession`` with ``initial_input`` is atomic: the Session row and the first Turn
(written by ``submission.persist_submission``, the durable submit path of ``SendInput``)
commit in one transaction, or neither does (for example ``RUNTIME_UNAVAILABLE`` when no
runtime serves the target leaves no Session behind).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from domainerrors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
)
from services.host.context import HostContext
from services.host.model.records import (
    InteractionRecord,
    SessionRecord,
    SessionSettingsValue,
    TurnRecord,
    subagents_to_json,
)
from services.host.model.session_rules import (
    CONVERSATIONS_SECTION_KEY,
    require_live,
    session_id_violation,
    session_not_found,
    validate_session_id,
)
from services.host.repository import hot_reads
from services.host.repository.sessions import NewSession
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.settings_port import RuntimeSettingsOutcome, RuntimeSettingsPort
from services.host.sessions.projects import project_containing, validate_section_key
from services.host.sessions.settings_catalog import merge_settings
from services.host.sessions.targets import resolve_launchable
from services.host.turns.reference_metadata import ReferenceMeta
from services.host.turns.submission import (
    Submission,
    SubmitResult,
    persist_submission,
    read_back,
    validate,
)

__all__ = [
    "MAX_TITLE_LENGTH",
    "CreateSessionCommand",
    "CreatedSession",
    "InitialInput",
    "SessionDetail",
    "SettingsUpdate",
    "create_session",
    "get_session",
    "read_live_session",
    "rename_session",
    "set_session_pinned",
    "update_session_settings",
]

MAX_TITLE_LENGTH = 512
MAX_CWD_LENGTH = 4096
DERIVED_TITLE_LENGTH = 80
"""A title derived from the first input keeps at most this many characters."""
CLEANUP_RETRY_SECONDS = 60.0
"""RetryInfo of ``RESOURCE_CLEANUP_PENDING``: maintenance completes cleanup rows in minutes."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _title_violation(title: str, field: str, *, required: bool) -> FieldViolation | None:
    if required and not title.strip():
        return FieldViolation(field, "must not be empty")
    if len(title) > MAX_TITLE_LENGTH:
        return FieldViolation(field, f"must be at most {MAX_TITLE_LENGTH} characters")
    if _CONTROL.search(title.replace("\n", " ").replace("\t", " ")):
        return FieldViolation(field, "must not contain control characters")
    return None


# --------------------------------------------------------------------------------- create


@dataclass(frozen=True)
class InitialInput:
    """The first input of a new Session: a ``new_turn`` submission (HOST-TURN-1)."""

    client_submit_id: str
    content: str
    mode: str = "agent"
    references: tuple[ReferenceMeta, ...] = ()

    def submission(self, workspace_id: str, session_id: str) -> Submission:
        """The ``SendInput`` equivalent of this input for the new Session."""
        return Submission(
            workspace_id=workspace_id,
            session_id=session_id,
            client_submit_id=self.client_submit_id,
            delivery="new_turn",
            target_turn_id=None,
            mode=self.mode,
            content=self.content,
            references=self.references,
        )


@dataclass(frozen=True)
class CreateSessionCommand:
    """A validated-on-entry ``CreateSession`` request (HOST-SES-1/2).

    ``provider_target_ref`` is deliberately absent: a client hint never overrides the ref
    Host derives from the target, so the domain never receives it.
    """

    workspace_id: str
    agent_target_id: str
    cwd: str
    session_id: str | None = None
    provider: str | None = None
    title: str | None = None
    rail_section_key: str | None = None
    settings: SessionSettingsValue = field(default_factory=SessionSettingsValue)
    initial_input: InitialInput | None = None
    has_initial_goal: bool = False
    has_isolation: bool = False


def _validate_create(command: CreateSessionCommand) -> None:
    violations = _create_violations(command)
    if violations:
        raise InvalidArgument("invalid CreateSession request", field_violations=violations)
    if command.initial_input is not None:
        # The session id is not known yet; any non-empty id passes the id check here.
        validate(
            command.initial_input.submission(command.workspace_id, command.session_id or "new"),
            field_prefix="initial_input.",
            rpc="CreateSession",
        )
    # Second-phase parts fail before anything is written.
    if command.has_initial_goal:
        raise NotImplementedError("CreateSession.initial_goal (HOST-GOAL-1, second phase)")
    if command.has_isolation:
        raise NotImplementedError("CreateSession.isolation (HOST-SES-7, second phase)")


def _create_violations(command: CreateSessionCommand) -> list[FieldViolation]:
    """The field violations of a ``CreateSession`` request's own fields, in field order."""
    violations: list[FieldViolation] = []
    if not command.agent_target_id:
        violations.append(FieldViolation("agent_target_id", "is required"))
    if not command.cwd.strip():
        violations.append(FieldViolation("cwd", "is required"))
    elif len(command.cwd) > MAX_CWD_LENGTH or _CONTROL.search(command.cwd):
        violations.append(FieldViolation("cwd", "is not a usable path"))
    if command.session_id is not None and (violation := session_id_violation(command.session_id)):
        violations.append(violation)
    if command.provider is not None and not command.provider:
        violations.append(FieldViolation("provider", "must not be empty when set"))
    if command.title is not None and (
        violation := _title_violation(command.title, "title", required=False)
    ):
        violations.append(violation)
    if command.rail_section_key is not None and (
        violation := validate_section_key(command.rail_section_key, "rail_section_key")
    ):
        violations.append(violation)
    if command.initial_input is not None and command.has_initial_goal:
        violations.append(
            FieldViolation("initial_goal", "initial_input and initial_goal are exclusive")
        )
    return violations


def derived_title(content: str) -> str:
    """A title from the first input: its first non-blank line, shortened (HOST-SES-1)."""
    line = next((line.strip() for line in content.splitlines() if line.strip()), "")
    line = _CONTROL.sub(" ", line)
    if len(line) <= DERIVED_TITLE_LENGTH:
        return line
    return line[: DERIVED_TITLE_LENGTH - 1].rstrip() + "\u2026"


def _is_identical_retry(existing: SessionRecord, command: CreateSessionCommand) -> bool:
    """Whether a create naming an existing id is a retry of the request that created it."""
    return (
        existing.is_live
        and existing.parent_session_id is None
        and existing.agent_target_id == command.agent_target_id
        and existing.cwd == command.cwd
        and (command.title is None or existing.title == command.title.strip())
        and (
            command.rail_section_key is None
            or existing.rail_section_key == command.rail_section_key
        )
    )


@dataclass(frozen=True)
class CreatedSession:
    """What ``CreateSession`` returns: the Session and, with ``initial_input``, its Turn."""

    session: SessionRecord
    first_turn: SubmitResult | None = None


async def create_session(ctx: HostContext, command: CreateSessionCommand) -> CreatedSession:
    """Create a root Session, persist it and read it back (HOST-SES-1, HOST-SES-2).

    Host resolves the target inside the creating transaction, derives provider and runtime
    target ref from it, copies its capabilities and subagent catalog (the launch catalog,
    HOST-MENT-1), normalizes the settings against its catalog, and assigns the
    ``rail_section_key`` once: an explicit placement is re-checked against the project rows
    in the same transaction, otherwise the project containing ``cwd`` or ``conversations``.

    With ``initial_input`` the first Turn is submitted through the ``SendInput`` path
    (``new_turn``, same idempotency by ``client_submit_id``) in the same transaction, and
    the title, when unset, is derived from the input. An identical retry naming the same
    ``session_id`` replays the submission.

    Raises:
        InvalidArgument: malformed input, reason ``PROVIDER_MISMATCH`` for a provider other
            than the target's, or settings outside the catalog.
        FailedPrecondition: ``AGENT_TARGET_UNAVAILABLE``, ``PROJECT_NOT_FOUND`` or
            ``RESOURCE_CLEANUP_PENDING`` (RetryInfo).
        AlreadyExists: ``SESSION_ID_IN_USE``.
        Unavailable: ``RUNTIME_UNAVAILABLE`` (with ``initial_input``); nothing is written.
        NotImplementedError: ``initial_goal`` or ``isolation`` (answered UNIMPLEMENTED);
            nothing is written.
    """
    _validate_create(command)
    workspace_id = command.workspace_id
    session_id = command.session_id or f"ses-{uuid.uuid4().hex}"
    title = (command.title or "").strip()
    first = command.initial_input
    if command.title is None and first is not None:
        title = derived_title(first.content)
    submission = first.submission(workspace_id, session_id) if first is not None else None

    async def persist_all(scope: HostTransaction) -> tuple[bool, str | None] | None:
        await _persist_session(ctx, scope, command, session_id, title)
        if submission is None:
            return None
        return await persist_submission(ctx, scope, submission)

    async with ctx.lanes.hold(workspace_id, session_id):
        stored = await ctx.transact(persist_all)
        record = await read_live_session(ctx, workspace_id, session_id)
        if submission is None or stored is None:
            return CreatedSession(record)
        replayed, interrupted = stored
        turn = await read_back(ctx, submission, replayed, interrupted)
        return CreatedSession(record, turn)


async def _persist_session(
    ctx: HostContext,
    repos: HostTransaction,
    command: CreateSessionCommand,
    session_id: str,
    title: str,
) -> None:
    """Check the create against the store and insert the Session row (nothing on a retry)."""
    workspace_id = command.workspace_id
    existing = await repos.sessions.get(workspace_id, session_id)
    if existing is not None:
        if command.session_id is not None and _is_identical_retry(existing, command):
            return
        raise _session_id_in_use(session_id)
    target = resolve_launchable(
        await repos.targets.get(command.agent_target_id), command.agent_target_id
    )
    if command.provider is not None and command.provider != target.provider:
        raise InvalidArgument(
            f"provider {command.provider!r} is not the target's provider",
            field_violations=[
                FieldViolation("provider", f"the target's provider is {target.provider!r}")
            ],
            reason="PROVIDER_MISMATCH",
        )
    settings = merge_settings(target.settings_catalog, SessionSettingsValue(), command.settings)
    if await repos.sessions.cleanup_pending(session_id):
        raise FailedPrecondition(
            f"Session id {session_id!r} is fenced by a pending resource cleanup",
            reason="RESOURCE_CLEANUP_PENDING",
            metadata={"session_id": session_id},
            retry_after_seconds=CLEANUP_RETRY_SECONDS,
        )
    section_key, project_path = await _placement(repos, command)
    inserted = await repos.sessions.insert(
        NewSession(
            workspace_id=workspace_id,
            session_id=session_id,
            agent_target_id=target.agent_target_id,
            provider=target.provider,
            provider_target_ref=target.launch_ref.runtime_target_ref,
            title=title,
            cwd=command.cwd,
            rail_section_key=section_key,
            rail_project_path=project_path,
            settings=settings,
            capabilities=target.capabilities,
            launch_subagents_json=subagents_to_json(target.subagents),
            created_at_unix_ms=ctx.clock(),
        )
    )
    if not inserted:
        raise _session_id_in_use(session_id)


async def _placement(
    repos: HostTransaction, command: CreateSessionCommand
) -> tuple[str, str | None]:
    """``(rail_section_key, rail_project_path)`` of a new Session, its project row locked."""
    workspace_id = command.workspace_id
    if command.rail_section_key not in (None, CONVERSATIONS_SECTION_KEY):
        assert command.rail_section_key is not None
        # Locked until commit: a concurrent RemoveProject waits, so it rehomes this
        # Session too or we see the project gone (HOST-SES-2).
        project = await repos.projects.get(workspace_id, command.rail_section_key, lock="share")
        if project is None:
            raise FailedPrecondition(
                f"project {command.rail_section_key!r} does not exist",
                reason="PROJECT_NOT_FOUND",
                metadata={"rail_section_key": command.rail_section_key},
            )
        return project.section_key, project.path
    if command.rail_section_key is None:
        project = project_containing(await repos.projects.in_workspace(workspace_id), command.cwd)
        if project is not None:
            locked = await repos.projects.get(workspace_id, project.section_key, lock="share")
            if locked is not None:
                return locked.section_key, locked.path
    return CONVERSATIONS_SECTION_KEY, None


def _session_id_in_use(session_id: str) -> AlreadyExists:
    return AlreadyExists(
        f"Session id {session_id!r} is in use",
        reason="SESSION_ID_IN_USE",
        metadata={"session_id": session_id},
    )


# ----------------------------------------------------------------------------------- read


async def read_live_session(ctx: HostContext, workspace_id: str, session_id: str) -> SessionRecord:
    """The authoritative live Session as stored now.

    Raises:
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
    """

    async def query(repos: HostTransaction) -> SessionRecord | None:
        return await repos.sessions.get(workspace_id, session_id)

    record = await ctx.transact(query, write=False)
    return require_live(record, workspace_id, session_id)


@dataclass(frozen=True)
class SessionDetail:
    """Canonical Session truth (HOST-SES-3)."""

    session: SessionRecord
    pending_interactions: list[InteractionRecord]
    active_turn: TurnRecord | None
    latest_turn: TurnRecord | None
    children: list[SessionRecord]


async def get_session(ctx: HostContext, workspace_id: str, session_id: str) -> SessionDetail:
    """Read one live Session with its Turns, pending Interactions and live descendants.

    All parts come from one read transaction, so they describe one committed state.

    Raises:
        InvalidArgument: a malformed id.
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
    """
    validate_session_id(session_id)
    found = await ctx.read(
        lambda conn: hot_reads.session_read_set(conn, workspace_id, session_id), one_statement=True
    )
    if found is None:
        raise session_not_found(workspace_id, session_id)
    return SessionDetail(
        session=require_live(found.session, workspace_id, session_id),
        pending_interactions=found.pending_interactions,
        active_turn=found.active_turn,
        latest_turn=found.latest_turn,
        children=found.children,
    )


# ------------------------------------------------------------------------------ mutations


async def rename_session(
    ctx: HostContext, workspace_id: str, session_id: str, title: str
) -> SessionRecord:
    """Set the title (trimmed) and return the authoritative Session (HOST-SES-5).

    Metadata edits do not move the Session in the rail: ``updated_at`` is left alone.

    Raises:
        InvalidArgument: an empty or oversized title.
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
    """
    validate_session_id(session_id)
    if (violation := _title_violation(title, "title", required=True)) is not None:
        raise InvalidArgument(violation.description, field_violations=[violation])

    async def command(repos: HostTransaction) -> None:
        await repos.session_rows.lock_with_root(workspace_id, session_id)
        require_live(await repos.sessions.get(workspace_id, session_id), workspace_id, session_id)
        await repos.sessions.set_title(workspace_id, session_id, title.strip())

    async with ctx.lanes.hold(workspace_id, session_id):
        await ctx.transact(command)
        return await read_live_session(ctx, workspace_id, session_id)


async def set_session_pinned(
    ctx: HostContext, workspace_id: str, session_id: str, pinned: bool
) -> SessionRecord:
    """Pin or unpin; pinning a pinned Session keeps its ``pinned_at`` (HOST-SES-5).

    Raises:
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
    """
    validate_session_id(session_id)

    async def command(repos: HostTransaction) -> None:
        await repos.session_rows.lock_with_root(workspace_id, session_id)
        session = require_live(
            await repos.sessions.get(workspace_id, session_id), workspace_id, session_id
        )
        if pinned and session.pinned_at_unix_ms is None:
            await repos.sessions.set_pinned_at(workspace_id, session_id, ctx.clock())
        elif not pinned and session.pinned_at_unix_ms is not None:
            await repos.sessions.set_pinned_at(workspace_id, session_id, None)

    async with ctx.lanes.hold(workspace_id, session_id):
        await ctx.transact(command)
        return await read_live_session(ctx, workspace_id, session_id)


@dataclass(frozen=True)
class SettingsUpdate:
    """The result of ``UpdateSessionSettings``: persisted Session and runtime outcome."""

    session: SessionRecord
    runtime: RuntimeSettingsOutcome


async def update_session_settings(
    ctx: HostContext,
    workspace_id: str,
    session_id: str,
    patch: SessionSettingsValue,
    runtime: RuntimeSettingsPort,
) -> SettingsUpdate:
    """Validate, normalize and persist settings, then apply them to the runtime (HOST-SES-6).

    Runs entirely in the Session's mutation lane (HOST-LANE-1): persistence and the runtime
    application of one update never interleave with another lifecycle mutation of the
    Session. The runtime's answer (including a failure) is reported, never hidden.

    Raises:
        InvalidArgument: values outside the target's catalog; nothing changes.
        FailedPrecondition: ``AGENT_TARGET_UNAVAILABLE`` when the Session's target (whose
            catalog validates the values) is no longer registered.
        NotFound: ``SESSION_NOT_FOUND`` or ``SESSION_DELETED``.
    """
    validate_session_id(session_id)

    async def command(repos: HostTransaction) -> None:
        # The row lock orders this read-merge-write after any other replica's (SCALE-1).
        await repos.session_rows.lock_with_root(workspace_id, session_id)
        session = require_live(
            await repos.sessions.get(workspace_id, session_id), workspace_id, session_id
        )
        target = (
            await repos.targets.get(session.agent_target_id)
            if session.agent_target_id is not None
            else None
        )
        if target is None:
            raise FailedPrecondition(
                f"the target of Session {session_id!r} is not registered; its settings "
                "catalog is unknown",
                reason="AGENT_TARGET_UNAVAILABLE",
                metadata={"agent_target_id": session.agent_target_id or ""},
            )
        settings = merge_settings(target.settings_catalog, session.settings, patch)
        if settings != session.settings:
            await repos.sessions.set_settings(workspace_id, session_id, settings)

    async with ctx.lanes.hold(workspace_id, session_id):
        await ctx.transact(command)
        persisted = await read_live_session(ctx, workspace_id, session_id)
        outcome = await runtime.apply_settings(
            workspace_id, session_id, persisted.settings, persisted.capabilities
        )
        return SettingsUpdate(persisted, outcome)
