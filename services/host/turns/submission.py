"""``SendInput``: the durable submit barrier and delivery modes (HOST-TURN-1..3).

One transaction persists the Turn (for ``new_turn`` and ``interrupt``), the Session
projection and the user message ``client-submit:user:<client_submit_id>`` referencing
that Turn, plus the runtime command in the outbox; the Turn is then read back by its
``client_submit_id`` before the call succeeds. The user message id doubles as the
idempotency record of every delivery (the message primary key makes the
``client_submit_id`` unique per Session), so an identical replay returns what the first
call stored and a replay with different content is ``CLIENT_SUBMIT_CONFLICT``.

Nothing is persisted when the call fails: not for a missing runtime
(``RUNTIME_UNAVAILABLE``), an active Turn (``TURN_ACTIVE``), a guidance target that is not
the active Turn (``GUIDANCE_TARGET_NOT_ACTIVE``) or an unadvertised delivery mode.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from domainerrors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    Unavailable,
)
from services.host.context import HostContext
from services.host.model.records import (
    Capabilities,
    SessionRecord,
    SessionSettingsValue,
    TurnRecord,
    decode_subagent_catalog,
    json_object,
    subagents_from_json,
)
from services.host.model.session_rules import session_not_found
from services.host.repository import hot_reads
from services.host.repository.row_records import (
    MessageRecord,
    message_record,
    session_record,
    turn_record,
)
from services.host.repository.row_views import MessageRow, SessionRow, TargetRow, TurnRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import (
    Guidance,
    InterruptReason,
    InterruptTurn,
    RuntimeSessionContext,
    StartTurn,
)
from services.host.runtime.presence import serving_identity
from services.host.turns import command_outbox, lifecycle, mentions
from services.host.turns.reference_metadata import (
    ReferenceMeta,
    encode_references,
    validate_references,
)
from services.host.turns.workspace_index import INDEX_READ_ERRORS

DELIVERIES = ("new_turn", "guidance", "interrupt")
MAX_CONTENT_CHARS = 1_048_576
MAX_SUBMIT_ID_CHARS = 256
RUNTIME_RETRY_SECONDS = 5.0


def runtime_unavailable(session: SessionRow) -> Unavailable:
    """UNAVAILABLE ``RUNTIME_UNAVAILABLE``: no runtime serving the Session's target is connected."""
    return Unavailable(
        f"no runtime serving {session.provider!r} is connected",
        reason="RUNTIME_UNAVAILABLE",
        metadata={"provider": session.provider, "agent_target_id": session.agent_target_id or ""},
        retry_after_seconds=RUNTIME_RETRY_SECONDS,
    )


class _Unread:
    """The type of :data:`UNREAD`."""


UNREAD = _Unread()
"""``session_context``'s default: the agent target has not been read yet."""


def user_message_id(client_submit_id: str) -> str:
    """The stable id of a submission's user row (HOST-TURN-1)."""
    return f"client-submit:user:{client_submit_id}"


@dataclass(frozen=True)
class Submission:
    """A validated ``SendInput`` request in domain terms."""

    workspace_id: str
    session_id: str
    client_submit_id: str
    delivery: str
    target_turn_id: str | None
    mode: str
    content: str
    references: tuple[ReferenceMeta, ...] = ()

    def fingerprint(self) -> str:
        """Digest of everything that makes two submissions the same one."""
        body = {
            "delivery": self.delivery,
            "target_turn_id": self.target_turn_id,
            "mode": self.mode,
            "content": self.content,
            "references": encode_references(self.references),
        }
        encoded = json.dumps(body, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(encoded).hexdigest()


@dataclass(frozen=True)
class SubmitResult:
    """What ``SendInput`` returns: the authoritative records after the submission."""

    turn: TurnRecord
    user_message: MessageRecord
    session: SessionRecord
    replayed: bool
    interrupted_turn_id: str | None = None


def validate(submission: Submission, *, field_prefix: str = "", rpc: str = "SendInput") -> None:
    """Reject malformed input before anything is read (SEC-2, HOST-TURN-3).

    Args:
        submission: the request in domain terms.
        field_prefix: request path of the submission fields (``initial_input.`` when
            ``CreateSession`` carries the first input).
        rpc: the RPC named in the error message.

    Raises:
        InvalidArgument: reason ``INVALID_REFERENCES`` for malformed references (checked
            first), else with one violation per bad field.
    """
    validate_references(submission.references, field=f"{field_prefix}references")
    violations: list[FieldViolation] = []

    def bad(name: str, description: str) -> None:
        violations.append(FieldViolation(f"{field_prefix}{name}", description))

    if not submission.session_id:
        bad("session_id", "must name a Session")
    if not submission.client_submit_id:
        bad("client_submit_id", "is required")
    elif len(submission.client_submit_id) > MAX_SUBMIT_ID_CHARS:
        bad("client_submit_id", f"must be at most {MAX_SUBMIT_ID_CHARS} characters")
    if submission.delivery not in DELIVERIES:
        bad("delivery", "must be new_turn, guidance or interrupt")
    if submission.delivery == "guidance" and not submission.target_turn_id:
        bad("target_turn_id", "is required for guidance")
    if submission.delivery != "guidance" and submission.target_turn_id is not None:
        bad("target_turn_id", "is only allowed for guidance")
    if not submission.content.strip() and not submission.references:
        bad("content", "must not be empty")
    if len(submission.content) > MAX_CONTENT_CHARS:
        bad("content", "is larger than 1 MiB")
    if violations:
        raise InvalidArgument(
            f"invalid {rpc}: {violations[0].field} {violations[0].description}",
            field_violations=violations,
        )


async def send_input(ctx: HostContext, submission: Submission) -> SubmitResult:
    """Persist a submission and hand its command to the runtime (HOST-TURN-1..3).

    A replay of a committed submission is answered from its durable rows by one read, with
    no lane and no write. Anything else runs in the Session's mutation lane, so two
    submissions to one Session never interleave (HOST-LANE-1); the store transaction
    (``BEGIN IMMEDIATE`` on SQLite, a row lock on Postgres) keeps that true across processes
    too.
    """
    validate(submission)
    durable = await _durable_rows(ctx, submission)
    if (
        durable.session is not None
        and durable.session.deleted_at_unix_ms is None
        and durable.message is not None
    ):
        check_replay(submission, durable.message, durable.submitted_turn)
        return _result(submission, durable, replayed=True, interrupted=None)
    async with ctx.lanes.hold(submission.workspace_id, submission.session_id):
        replayed, interrupted = await ctx.transact(
            lambda repos: persist_submission(ctx, repos, submission)
        )
        return await read_back(ctx, submission, replayed, interrupted)


async def read_back(
    ctx: HostContext, submission: Submission, replayed: bool, interrupted: str | None
) -> SubmitResult:
    """Read a persisted submission back through its durable identity (HOST-TURN-1).

    Raises:
        Unavailable: ``SUBMIT_NOT_DURABLE`` when its rows are not (or no longer) there.
    """
    return _result(submission, await _durable_rows(ctx, submission), replayed, interrupted)


async def _durable_rows(ctx: HostContext, submission: Submission) -> hot_reads.SubmissionRows:
    return await ctx.read(
        lambda conn: hot_reads.submission_rows(
            conn,
            submission.workspace_id,
            submission.session_id,
            user_message_id(submission.client_submit_id),
            submission.client_submit_id,
            guidance=submission.delivery == "guidance",
        ),
        one_statement=True,
    )


def _result(
    submission: Submission,
    durable: hot_reads.SubmissionRows,
    replayed: bool,
    interrupted: str | None,
) -> SubmitResult:
    """The submission as read back through its durable identity (HOST-TURN-1)."""
    turn = durable.guided_turn if submission.delivery == "guidance" else durable.submitted_turn
    if durable.message is None or durable.session is None or turn is None:
        raise Unavailable(
            "the submission could not be read back; retry with the same client_submit_id",
            reason="SUBMIT_NOT_DURABLE",
            retry_after_seconds=1.0,
        )
    return SubmitResult(
        turn_record(turn),
        message_record(durable.message),
        session_record(durable.session),
        replayed,
        interrupted,
    )


async def persist_submission(
    ctx: HostContext, repos: HostTransaction, submission: Submission
) -> tuple[bool, str | None]:
    """Write a validated submission in the open transaction (the caller holds the lane).

    ``SendInput`` runs it alone; ``CreateSession`` runs it in the transaction that
    inserts the Session, so a Session with ``initial_input`` exists only with its Turn.

    Returns:
        ``(replayed, interrupted_turn_id)``.

    Raises:
        NotFound, FailedPrecondition, Unavailable, AlreadyExists: see :func:`send_input`;
            nothing of the transaction commits.
    """
    ws, sid = submission.workspace_id, submission.session_id
    session = await repos.session_rows.lock_with_root(ws, sid)
    if session is None or session.deleted_at_unix_ms is not None:
        raise session_not_found(ws, sid)
    existing = await repos.messages.get(ws, sid, user_message_id(submission.client_submit_id))
    if existing is not None:
        turn = await repos.turns.by_client_submit_id(ws, sid, submission.client_submit_id)
        check_replay(submission, existing, turn)
        return True, None
    target = await _check_deliverable(ctx, repos, session, submission)
    now = ctx.clock()
    active = (
        await repos.turns.get(ws, sid, session.active_turn_id) if session.active_turn_id else None
    )
    if active is not None and not lifecycle.is_active(active):
        active = None  # a stale reference never blocks a submission
    rewrite = _rewrite(ctx, session, submission)
    if submission.delivery == "guidance":
        _guide(ctx, repos, session, active, submission, rewrite, now)
        return False, None
    interrupted: str | None = None
    if active is not None:
        if submission.delivery == "new_turn":
            raise FailedPrecondition(
                f"Turn {active.turn_id!r} is active",
                reason="TURN_ACTIVE",
                metadata={"active_turn_id": active.turn_id},
            )
        # An interrupt delivery stops the active Turn, then starts the new one. The
        # replaced Turn settles `canceled` (`interrupted` is reserved for delete and
        # runtime loss, HOST-TURN-5).
        await lifecycle.settle(repos, session, active, "canceled", now)
        command_outbox.enqueue(
            repos, ctx, session, InterruptTurn(active.turn_id, InterruptReason.DELIVERY)
        )
        interrupted = active.turn_id
    await _start_turn(ctx, repos, session, target, submission, rewrite, now)
    return False, interrupted


async def _check_deliverable(
    ctx: HostContext, repos: HostTransaction, session: SessionRow, submission: Submission
) -> TargetRow | None:
    """Refuse a submission no enabled target and connected runtime can take.

    Returns:
        The Session's agent target row (``None`` without one), read once per submission.

    Raises:
        FailedPrecondition: ``AGENT_TARGET_UNAVAILABLE`` or ``DELIVERY_MODE_UNSUPPORTED``.
        Unavailable: ``RUNTIME_UNAVAILABLE``.
    """
    ws = session.workspace_id
    capabilities = Capabilities.from_json(session.capabilities_json)
    target = None
    if session.agent_target_id:
        target = await repos.session_rows.target(ws, session.agent_target_id)
        if target is not None:
            if not target.enabled:
                raise FailedPrecondition(
                    f"agent target {session.agent_target_id!r} is disabled",
                    reason="AGENT_TARGET_UNAVAILABLE",
                )
            capabilities = Capabilities.from_json(target.capabilities_json)
    # SCALE-2: a runtime attached to any replica serves it (a local link answers at once).
    runtime = await serving_identity(ctx, ws, session.agent_target_id, session.provider)
    if runtime is None:
        raise runtime_unavailable(session)
    if submission.delivery in ("guidance", "interrupt"):
        advertised = getattr(capabilities, submission.delivery) and bool(
            runtime.capabilities.get(submission.delivery)
        )
        if not advertised:
            raise FailedPrecondition(
                f"the target does not support {submission.delivery} delivery",
                reason="DELIVERY_MODE_UNSUPPORTED",
                metadata={"delivery": submission.delivery},
            )
    return target


def _guide(
    ctx: HostContext,
    repos: HostTransaction,
    session: SessionRow,
    active: TurnRow | None,
    submission: Submission,
    rewrite: _Rewrite,
    now: int,
) -> None:
    """Add a guidance message to the active Turn and queue its ``guidance`` command.

    Raises:
        FailedPrecondition: ``GUIDANCE_TARGET_NOT_ACTIVE``.
    """
    if active is None or active.turn_id != submission.target_turn_id:
        raise FailedPrecondition(
            f"Turn {submission.target_turn_id!r} is not the active Turn",
            reason="GUIDANCE_TARGET_NOT_ACTIVE",
            metadata={"target_turn_id": submission.target_turn_id or ""},
        )
    message = _user_message(repos, session, active, submission, rewrite, now)
    command = Guidance(
        target_turn_id=active.turn_id,
        user_message_id=message.message_id,
        prompt=rewrite.prompt,
        references=submission.references,
    )
    command_outbox.enqueue(repos, ctx, session, command)


async def _start_turn(
    ctx: HostContext,
    repos: HostTransaction,
    session: SessionRow,
    target: TargetRow | None,
    submission: Submission,
    rewrite: _Rewrite,
    now: int,
) -> None:
    """Add the queued Turn with its user message and queue its ``start_turn`` command.

    ``target`` is the agent target :func:`_check_deliverable` read in this transaction.
    """
    turn = repos.turns.add(
        workspace_id=session.workspace_id,
        session_id=session.session_id,
        turn_id=f"turn-{uuid.uuid4()}",
        client_submit_id=submission.client_submit_id,
        submit_fingerprint=submission.fingerprint(),
        phase="queued",
        outcome=None,
        origin="user",
        delivery=submission.delivery,
        mode=submission.mode,
        root_turn_id=None,
        version=1,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
    )
    await repos.turns.flush()
    repos.session_rows.update(
        session,
        active_turn_id=turn.turn_id,
        updated_at_unix_ms=max(session.updated_at_unix_ms, now),
    )
    message = _user_message(repos, session, turn, submission, rewrite, now)
    command = StartTurn(
        turn_id=turn.turn_id,
        client_submit_id=submission.client_submit_id,
        user_message_id=message.message_id,
        prompt=rewrite.prompt,
        mode=mentions.ComposerMode(submission.mode),
        references=submission.references,
        session=await session_context(repos, session, target=target),
    )
    command_outbox.enqueue(repos, ctx, session, command)


def check_replay(
    submission: Submission, message: MessageRow | MessageRecord, turn: TurnRow | None
) -> None:
    """Accept an identical earlier submission as a replay; refuse anything else.

    ``message`` is the row the earlier submission wrote and ``turn`` the Turn found by its
    ``client_submit_id`` (none for guidance).

    Raises:
        AlreadyExists: ``CLIENT_SUBMIT_CONFLICT``.
    """
    if turn is not None:
        same = turn.submit_fingerprint == submission.fingerprint()
    else:
        # A guidance row: its identity is the guided Turn, the typed text and references.
        typed = message.command if message.command is not None else _text(message)
        same = (
            submission.delivery == "guidance"
            and message.turn_id == submission.target_turn_id
            and typed == submission.content
            and message.references_json == encode_references(submission.references)
        )
    if not same:
        raise AlreadyExists(
            f"client_submit_id {submission.client_submit_id!r} was used for another submission",
            reason="CLIENT_SUBMIT_CONFLICT",
            metadata={"client_submit_id": submission.client_submit_id},
        )


def _text(message: MessageRow | MessageRecord) -> str:
    text = json_object(message.payload_json).get("text")
    return text if isinstance(text, str) else ""


@dataclass(frozen=True)
class _Rewrite:
    prompt: str
    command: str | None
    skill_mentions_json: str | None
    agent_mentions_json: str | None


def _rewrite(ctx: HostContext, session: SessionRow, submission: Submission) -> _Rewrite:
    """Resolve ``@agent`` and ``/skill:`` tokens against the launch catalog (HOST-MENT-1..3).

    When the workspace file index cannot be read, no ``@name`` can be told from a file of
    that name, so none is a delegation: the tokens stay literal, ``/skill:`` tokens are
    still rewritten and the send goes ahead (HOST-MENT-4). A launch catalog that cannot be
    decoded is the same: the ``@`` menu offers no agent from it (``CATALOG_UNAVAILABLE``),
    so a send delegates to none either (ADR 0027).
    """
    mode = mentions.ComposerMode(submission.mode)
    catalog = _launch_catalog(session)
    resolution: mentions.MentionResolution | None = None
    degraded = catalog is None
    if catalog is not None:
        try:
            resolution = mentions.resolve_mentions(
                submission.content,
                mode=mode,
                subagents=catalog,
                is_workspace_entry=ctx.workspace_index(session.cwd),
            )
        except INDEX_READ_ERRORS:
            degraded = True
    if degraded:
        resolution = mentions.resolve_mentions(
            submission.content, mode=mode, subagents=(), is_workspace_entry=_no_entries
        )
    if resolution is None:
        return _Rewrite(submission.content, None, None, None)
    return _Rewrite(
        resolution.prompt,
        resolution.command,
        mentions.encode_skill_mentions(resolution.skill_mentions),
        mentions.encode_agent_mentions(resolution.agent_mentions),
    )


def _no_entries(name: str) -> bool:
    """The index of no catalog: never asked, since no name can be a delegation."""
    return False


def _launch_catalog(session: SessionRow) -> list[mentions.Subagent] | None:
    """The Session's launch catalog, read as strictly as the ``@`` menu reads it.

    ``None`` when it cannot be decoded (HOST-MENT-4): a lenient read here would let a send
    delegate to a name the menu hides.
    """
    catalog = decode_subagent_catalog(getattr(session, "launch_subagents_json", None))
    if catalog is None:
        return None
    return [mentions.Subagent(s.name, s.description) for s in catalog]


def _user_message(
    repos: HostTransaction,
    session: SessionRow,
    turn: TurnRow,
    submission: Submission,
    rewrite: _Rewrite,
    now: int,
) -> MessageRow:
    sequence, version = repos.session_rows.next_message_cursor(session)
    return repos.messages.add(
        workspace_id=session.workspace_id,
        session_id=session.session_id,
        message_id=user_message_id(submission.client_submit_id),
        sequence=sequence,
        version=version,
        turn_id=turn.turn_id,
        occurred_at_unix_ms=now,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
        role="user",
        kind="text",
        payload_json=json.dumps({"text": submission.content}, ensure_ascii=False),
        user_visible_assistant_response=False,
        command=rewrite.command,
        skill_mentions_json=rewrite.skill_mentions_json,
        agent_mentions_json=rewrite.agent_mentions_json,
        references_json=encode_references(submission.references),
    )


async def session_context(
    repos: HostTransaction, session: SessionRow, *, target: TargetRow | _Unread | None = UNREAD
) -> RuntimeSessionContext:
    """What a runtime needs to run the Session: target, launch, settings, catalog, resume.

    ``target`` is the Session's agent target when the caller read it in this transaction
    already (``None``: it has none or it is not registered); by default it is read here.
    """
    target_ref: str | None = None
    options: str | None = None
    if session.agent_target_id:
        if isinstance(target, _Unread):
            target = await repos.session_rows.target(session.workspace_id, session.agent_target_id)
        if target is not None:
            launch = json_object(target.launch_ref_json)
            ref = launch.get("runtime_target_ref", launch.get("runtimeTargetRef"))
            raw_options = launch.get("options_json", launch.get("optionsJson"))
            target_ref = ref if isinstance(ref, str) else ""
            options = raw_options if isinstance(raw_options, str) else ""
    resume = json_object(session.provider_resume_json)
    provider_ref = resume.get("providerSessionRef")
    runtime_context = resume.get("runtimeContextJson")
    return RuntimeSessionContext(
        agent_target_id=session.agent_target_id or "",
        provider=session.provider,
        cwd=session.cwd or "",
        settings=SessionSettingsValue.from_json(session.settings_json),
        # The runtime keeps the lenient read it always had (malformed entries dropped);
        # only delegation follows the menu's strict read.
        subagents=tuple(
            mentions.Subagent(s.name, s.description)
            for s in subagents_from_json(getattr(session, "launch_subagents_json", None))
        ),
        runtime_target_ref=target_ref,
        launch_options_json=options,
        provider_session_ref=provider_ref if isinstance(provider_ref, str) else None,
        runtime_context_json=runtime_context if isinstance(runtime_context, str) else None,
        parent_session_id=session.parent_session_id or None,
    )


def restored_input(message: MessageRow | MessageRecord | None) -> str | None:
    """The text a composer restores after a stop: ``command`` when rewritten, else content."""
    if message is None:
        return None
    return message.command if message.command is not None else _text(message)


__all__: Sequence[str] = (
    "Submission",
    "SubmitResult",
    "check_replay",
    "persist_submission",
    "read_back",
    "restored_input",
    "send_input",
    "session_context",
    "user_message_id",
    "validate",
)
