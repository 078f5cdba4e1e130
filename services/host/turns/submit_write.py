"""The ``SendInput`` submit as one synchronous write function (HOST-TURN-1..3, ADR 0034).

:func:`write_submission` is every statement of a submit and every decision between them: the
Session locked with its root (SCALE-1), the replay check, the agent target and the runtime
link, the active Turn, then the Turn, the Session's cursor, the user message and the runtime
command. It is a function of a :class:`~store.direct_writes.WriteConnection`, so one
implementation runs two ways:

- ``new_turn`` and ``guidance`` (the hot path) as a **direct write**: on the store's writer
  thread in one hop (``HostContext.write_activity``), which also appends the activity events
  the function's result describes and publishes them after the commit; the command is
  dispatched in the same commit to the link that serves the Session.
- inside an **ORM transaction**, on its connection (``HostTransaction.write``): an
  ``interrupt`` of an active Turn, whose settlement (``lifecycle.settle``, shared with stops,
  runtime settlements and deletes) runs on the ORM first, and ``CreateSession``'s initial
  input, in the transaction that inserts the Session. The caller records the rows written
  (``SubmitWrite.record``) so the transaction's activity outbox describes them, and the
  command row stays ``pending`` for the transaction's dispatch participant.

Runs on a thread on the direct path: it reads the runtime registry (an atomic copy of its
links) and the workspace file index, and encodes the command, but never touches the event loop.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from domainerrors import FailedPrecondition, Unavailable
from services.host.context import HostContext
from services.host.model.records import (
    Capabilities,
    SessionSettingsValue,
    TurnRecord,
    decode_subagent_catalog,
    json_object,
    subagents_from_json,
)
from services.host.model.session_rules import session_not_found
from services.host.repository import submit_rows
from services.host.repository.changes import ChangeSet, ResolvedState
from services.host.repository.row_records import MessageRecord, message_record, turn_record
from services.host.repository.row_views import SessionRow, TargetRow, TurnRow
from services.host.repository.submit_rows import NewMessage, NewTurn
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import Guidance, RuntimeSessionContext, StartTurn
from services.host.runtime.registry import RuntimeIdentity, RuntimeLinkHandle
from services.host.turns import command_outbox, lifecycle, mentions
from services.host.turns.reference_metadata import encode_references
from services.host.turns.submit_request import Submission, check_replay, user_message_id
from services.host.turns.workspace_index import INDEX_READ_ERRORS
from store.direct_writes import WriteConnection

__all__ = [
    "RUNTIME_RETRY_SECONDS",
    "ActiveTurnToSettle",
    "SubmitWrite",
    "runtime_session_context",
    "runtime_unavailable",
    "write_submission",
]

RUNTIME_RETRY_SECONDS = 5.0


def runtime_unavailable(session: SessionRow) -> Unavailable:
    """UNAVAILABLE ``RUNTIME_UNAVAILABLE``: no runtime serving the Session's target is connected."""
    return Unavailable(
        f"no runtime serving {session.provider!r} is connected",
        reason="RUNTIME_UNAVAILABLE",
        metadata={"provider": session.provider, "agent_target_id": session.agent_target_id or ""},
        retry_after_seconds=RUNTIME_RETRY_SECONDS,
    )


class ActiveTurnToSettle(Exception):
    """An ``interrupt`` found an active Turn: it settles on the ORM path first.

    Raised before the function wrote anything; the caller settles the Turn in an ORM
    transaction and runs :func:`write_submission` again on that transaction's connection.
    """

    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id


@dataclass(frozen=True)
class SubmitWrite:
    """What a submit wrote, for the steps after it (events, dispatch, the reply).

    Attributes:
        replayed: the submission had committed before; nothing was written.
        interrupted: the Turn the submission interrupted (settled by the caller).
        session: the Session row as locked (before the submit's changes).
        turns: the Turn it created (none for guidance or a replay).
        messages: the user message it wrote.
        session_fields: the Session columns it changed.
        cursor: the Session's active Turn and message version after it.
        unsettled: Turns its messages belong to that are active (the guided Turn).
        dispatched: the commands to hand to the link after the commit (direct writes).
    """

    replayed: bool
    interrupted: str | None = None
    session: Any = None
    turns: tuple[TurnRecord, ...] = ()
    messages: tuple[MessageRecord, ...] = ()
    session_fields: frozenset[str] = frozenset()
    cursor: tuple[str | None, int] = (None, 0)
    unsettled: tuple[str, ...] = ()
    dispatched: command_outbox.Dispatched | None = field(default=None, compare=False)

    def activity(self) -> tuple[ChangeSet, ResolvedState]:
        """The changes its events describe, and the state they report (nothing to read)."""
        if self.replayed:
            return ChangeSet((), (), (), {}, {}, {}), ResolvedState()
        key = (self.session.workspace_id, self.session.session_id)
        changes = ChangeSet(
            messages=self.messages,
            turns=self.turns,
            interactions=(),
            sessions={key: self.session_fields},
            deleted={},
            restored={},
        )
        state = ResolvedState(
            sessions={key: self.cursor},
            settled={(*key, turn_id): False for turn_id in self.unsettled},
        )
        return changes, state

    def record(self, repos: HostTransaction, ctx: HostContext) -> None:
        """Record what it wrote in the ORM transaction whose connection it ran on.

        The rows go into the transaction's changes (its activity outbox describes them) and
        the Session's pending commands into the transaction's dispatch.
        """
        if self.replayed:
            return
        repos.changes.written(turns=self.turns, messages=self.messages)
        repos.changes.session(
            self.session.workspace_id, self.session.session_id, self.session_fields
        )
        command_outbox.enlist_dispatch(repos, ctx, self.session)


def write_submission(
    conn: WriteConnection,
    ctx: HostContext,
    submission: Submission,
    now: int,
    *,
    dispatch: bool,
    interrupted: str | None = None,
    remote: Sequence[RuntimeIdentity] = (),
) -> SubmitWrite:
    """Write a validated submission in the open write transaction (the caller holds the lane).

    Args:
        conn: the transaction: a direct write's, or an ORM transaction's connection.
        ctx: the ``HostContext`` (registry, workspace index, command codec).
        submission: the request.
        now: the submission's time (unix ms).
        dispatch: dispatch the command in this commit (a direct write); otherwise the row is
            written ``pending`` and :meth:`SubmitWrite.record` enlists the dispatch.
        interrupted: the Turn an ``interrupt`` settled before this call (the ORM path).
        remote: runtimes attached to other replicas (SCALE-2, read before the write; empty on
            a single node): one that serves the Session makes it deliverable, its command
            then stays ``pending`` for the wake-up after the commit.

    Raises:
        NotFound, FailedPrecondition, Unavailable, AlreadyExists: see ``send_input``; nothing
            of the transaction commits.
        ActiveTurnToSettle: an ``interrupt`` found an active Turn; nothing was written.
    """
    ws, sid = submission.workspace_id, submission.session_id
    session = submit_rows.lock_with_root(conn, ws, sid)
    if session is None or session.deleted_at_unix_ms is not None:
        raise session_not_found(ws, sid)
    found = submit_rows.submit_rows(conn, ws, sid, user_message_id(submission.client_submit_id))
    if found.message is not None:
        turn = submit_rows.turn_by_client_submit_id(conn, ws, sid, submission.client_submit_id)
        check_replay(submission, found.message, turn)
        return SubmitWrite(replayed=True)
    link = _check_deliverable(ctx, found.target, session, submission, remote)
    active: TurnRow | None = found.active
    if active is not None and not lifecycle.is_active(active):
        active = None  # a stale reference never blocks a submission
    rewrite = _rewrite(ctx, session, submission)
    step = _Step(
        conn,
        ctx,
        session,
        submission,
        rewrite,
        now,
        link if dispatch else None,
        found.has_pending,
    )
    if submission.delivery == "guidance":
        return step.guide(active)
    if active is not None:
        if submission.delivery == "new_turn":
            raise FailedPrecondition(
                f"Turn {active.turn_id!r} is active",
                reason="TURN_ACTIVE",
                metadata={"active_turn_id": active.turn_id},
            )
        # An interrupt delivery stops the active Turn, then starts the new one. The
        # replaced Turn settles `canceled` (`interrupted` is reserved for delete and
        # runtime loss, HOST-TURN-5): on the ORM path, shared with every settlement.
        raise ActiveTurnToSettle(active.turn_id)
    return step.start_turn(found.target if session.agent_target_id else None, interrupted)


def _check_deliverable(
    ctx: HostContext,
    target: TargetRow | None,
    session: SessionRow,
    submission: Submission,
    remote: Sequence[RuntimeIdentity],
) -> RuntimeLinkHandle | None:
    """Refuse a submission no enabled target and connected runtime can take.

    ``target`` is the Session's agent target row (``None``: it has none, or it is not
    registered).

    Returns:
        The local link that serves the Session (``None`` when a runtime on another replica
        serves it).

    Raises:
        FailedPrecondition: ``AGENT_TARGET_UNAVAILABLE`` or ``DELIVERY_MODE_UNSUPPORTED``.
        Unavailable: ``RUNTIME_UNAVAILABLE``.
    """
    ws = session.workspace_id
    capabilities = Capabilities.from_json(session.capabilities_json)
    if session.agent_target_id and target is not None:
        if not target.enabled:
            raise FailedPrecondition(
                f"agent target {session.agent_target_id!r} is disabled",
                reason="AGENT_TARGET_UNAVAILABLE",
            )
        capabilities = Capabilities.from_json(target.capabilities_json)
    link = ctx.runtimes.link_for(ws, session.agent_target_id, session.provider)
    runtime = link.identity if link is not None else None
    if runtime is None:
        runtime = next(
            (i for i in remote if i.serves(ws, session.agent_target_id, session.provider)), None
        )
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
    return link


@dataclass(frozen=True)
class _Rewrite:
    prompt: str
    command: str | None
    skill_mentions_json: str | None
    agent_mentions_json: str | None


@dataclass(frozen=True)
class _Step:
    """The writes of a submit that passed its checks."""

    conn: WriteConnection
    ctx: HostContext
    session: Any
    submission: Submission
    rewrite: _Rewrite
    now: int
    link: RuntimeLinkHandle | None
    has_pending: bool

    def guide(self, active: TurnRow | None) -> SubmitWrite:
        """Add a guidance message to the active Turn and queue its ``guidance`` command.

        Raises:
            FailedPrecondition: ``GUIDANCE_TARGET_NOT_ACTIVE``.
        """
        submission = self.submission
        if active is None or active.turn_id != submission.target_turn_id:
            raise FailedPrecondition(
                f"Turn {submission.target_turn_id!r} is not the active Turn",
                reason="GUIDANCE_TARGET_NOT_ACTIVE",
                metadata={"target_turn_id": submission.target_turn_id or ""},
            )
        session = self.session
        message = self._user_message(active.turn_id)
        submit_rows.set_message_cursor(
            self.conn,
            session.workspace_id,
            session.session_id,
            active_turn_id=session.active_turn_id,
            updated_at_unix_ms=session.updated_at_unix_ms,
            next_message_sequence=message.sequence + 1,
            message_version=message.version,
        )
        submit_rows.insert_message(self.conn, message)
        command = Guidance(
            target_turn_id=active.turn_id,
            user_message_id=message.message_id,
            prompt=self.rewrite.prompt,
            references=submission.references,
        )
        return SubmitWrite(
            replayed=False,
            session=session,
            messages=(message_record(message),),
            session_fields=frozenset({"next_message_sequence", "message_version"}),
            cursor=(session.active_turn_id, message.version),
            unsettled=(active.turn_id,),
            dispatched=self._enqueue(command),
        )

    def start_turn(self, target: TargetRow | None, interrupted: str | None) -> SubmitWrite:
        """Add the queued Turn with its user message and queue its ``start_turn`` command."""
        session, submission, now = self.session, self.submission, self.now
        turn = NewTurn(
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
        submit_rows.insert_turn(self.conn, turn)
        message = self._user_message(turn.turn_id)
        updated_at = max(session.updated_at_unix_ms, now)
        submit_rows.set_message_cursor(
            self.conn,
            session.workspace_id,
            session.session_id,
            active_turn_id=turn.turn_id,
            updated_at_unix_ms=updated_at,
            next_message_sequence=message.sequence + 1,
            message_version=message.version,
        )
        submit_rows.insert_message(self.conn, message)
        fields = {"active_turn_id", "next_message_sequence", "message_version"}
        if updated_at != session.updated_at_unix_ms:
            fields.add("updated_at_unix_ms")
        command = StartTurn(
            turn_id=turn.turn_id,
            client_submit_id=submission.client_submit_id,
            user_message_id=message.message_id,
            prompt=self.rewrite.prompt,
            mode=mentions.ComposerMode(submission.mode),
            references=submission.references,
            session=runtime_session_context(session, target),
        )
        return SubmitWrite(
            replayed=False,
            interrupted=interrupted,
            session=session,
            turns=(turn_record(turn),),
            messages=(message_record(message),),
            session_fields=frozenset(fields),
            cursor=(turn.turn_id, message.version),
            dispatched=self._enqueue(command),
        )

    def _user_message(self, turn_id: str) -> NewMessage:
        """The user message row at the Session's next cursor (HOST-TURN-1)."""
        session, submission, rewrite, now = self.session, self.submission, self.rewrite, self.now
        return NewMessage(
            workspace_id=session.workspace_id,
            session_id=session.session_id,
            message_id=user_message_id(submission.client_submit_id),
            sequence=session.next_message_sequence,
            version=session.message_version + 1,
            turn_id=turn_id,
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

    def _enqueue(self, command: Any) -> command_outbox.Dispatched | None:
        return command_outbox.enqueue_written(
            self.conn,
            self.ctx,
            self.session,
            command,
            self.now,
            link=self.link,
            has_pending=self.has_pending,
        )


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


def runtime_session_context(session: SessionRow, target: TargetRow | None) -> RuntimeSessionContext:
    """What a runtime needs to run the Session: target, launch, settings, catalog, resume.

    ``target`` is the Session's agent target row (``None``: it has none or it is not
    registered).
    """
    target_ref: str | None = None
    options: str | None = None
    if session.agent_target_id and target is not None:
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
