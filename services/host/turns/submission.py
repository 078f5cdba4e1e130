"""``SendInput``: the durable submit barrier and delivery modes (HOST-TURN-1..3).

One transaction persists the Turn (for ``new_turn`` and ``interrupt``), the Session
projection and the user message ``client-submit:user:<client_submit_id>`` referencing
that Turn, plus the runtime command in the outbox; the Turn is then read back by its
``client_submit_id`` before the call succeeds. The user message id doubles as the
idempotency record of every delivery (the message primary key makes the
``client_submit_id`` unique per Session), so an identical replay returns what the first
call stored and a replay with different content is ``CLIENT_SUBMIT_CONFLICT``
(``turns.submit_request``).

The transaction is one write function (``turns.submit_write``, ADR 0034): for ``new_turn``
and ``guidance`` a direct write in one thread hop, with its activity events and the command
dispatched in the same commit; for an ``interrupt`` of an active Turn, on an ORM transaction's
connection after the Turn settled (``lifecycle.settle``); for ``CreateSession``'s initial input,
in the transaction that inserts the Session (:func:`persist_submission`).

Nothing is persisted when the call fails: not for a missing runtime
(``RUNTIME_UNAVAILABLE``), an active Turn (``TURN_ACTIVE``), a guidance target that is not
the active Turn (``GUIDANCE_TARGET_NOT_ACTIVE``) or an unadvertised delivery mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from domainerrors import Unavailable
from services.host.context import HostContext
from services.host.model.records import SessionRecord, TurnRecord
from services.host.repository import hot_reads
from services.host.repository.command_rows import SessionRoute
from services.host.repository.row_records import (
    MessageRecord,
    message_record,
    session_record,
    turn_record,
)
from services.host.repository.row_views import SessionRow, TargetRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import InterruptReason, InterruptTurn, RuntimeSessionContext
from services.host.runtime.registry import RuntimeIdentity
from services.host.turns import command_outbox, lifecycle
from services.host.turns.submit_request import (
    DELIVERIES,
    MAX_CONTENT_CHARS,
    MAX_SUBMIT_ID_CHARS,
    Submission,
    check_replay,
    restored_input,
    user_message_id,
    validate,
)
from services.host.turns.submit_write import (
    RUNTIME_RETRY_SECONDS,
    ActiveTurnToSettle,
    SubmitWrite,
    runtime_session_context,
    runtime_unavailable,
    write_submission,
)
from store.direct_reads import ReadConnection


class _Unread:
    """The type of :data:`UNREAD`."""


UNREAD = _Unread()
"""``session_context``'s default: the agent target has not been read yet."""


@dataclass(frozen=True)
class SubmitResult:
    """What ``SendInput`` returns: the authoritative records after the submission."""

    turn: TurnRecord
    user_message: MessageRecord
    session: SessionRecord
    replayed: bool
    interrupted_turn_id: str | None = None


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
        # An interrupt of an active Turn settles it on the ORM path; so one the probe saw
        # goes there at once, and one that became active since comes back from the write.
        settles = (
            submission.delivery == "interrupt"
            and durable.session is not None
            and durable.session.active_turn_id is not None
        )
        if not settles:
            now = ctx.clock()
            try:
                remote = await _remote_runtimes(ctx, durable.session)
                written, durable_now = await ctx.write_activity_then_read(
                    lambda conn: write_submission(
                        conn, ctx, submission, now, dispatch=True, remote=remote
                    ),
                    lambda conn: _submission_rows(conn, submission),
                )
            except ActiveTurnToSettle:
                settles = True
            else:
                if written.dispatched is not None:
                    written.dispatched.send()
                elif not written.replayed and written.session is not None:
                    # A runtime on another replica serves it: the command waits ``pending``.
                    session = written.session
                    await command_outbox.dispatch_unserved(
                        ctx,
                        [
                            SessionRoute(
                                session.workspace_id,
                                session.session_id,
                                session.agent_target_id,
                                session.provider,
                            )
                        ],
                    )
                if durable_now is None:  # the store failed the read, not the write
                    return await read_back(ctx, submission, written.replayed, None)
                return _result(submission, durable_now, written.replayed, None)
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
    return await ctx.read(lambda conn: _submission_rows(conn, submission), one_statement=True)


def _submission_rows(conn: ReadConnection, submission: Submission) -> hot_reads.SubmissionRows:
    """The submission's durable rows, found by its identity (one statement on Postgres)."""
    return hot_reads.submission_rows(
        conn,
        submission.workspace_id,
        submission.session_id,
        user_message_id(submission.client_submit_id),
        submission.client_submit_id,
        guidance=submission.delivery == "guidance",
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
    """Write a validated submission in the open ORM transaction (the caller holds the lane).

    The submit's write function (``turns.submit_write``) on the transaction's connection:
    ``CreateSession`` runs it in the transaction that inserts the Session, so a Session with
    ``initial_input`` exists only with its Turn, and ``SendInput`` runs it here for an
    ``interrupt`` of an active Turn, which settles first (``lifecycle.settle``, with the
    ``interrupt_turn`` command queued before the new Turn's ``start_turn``).

    Returns:
        ``(replayed, interrupted_turn_id)``.

    Raises:
        NotFound, FailedPrecondition, Unavailable, AlreadyExists: see :func:`send_input`;
            nothing of the transaction commits.
    """
    now = ctx.clock()
    remote = await _remote_runtimes(ctx, None)
    written: SubmitWrite
    try:
        written = await repos.write(
            lambda conn: write_submission(conn, ctx, submission, now, dispatch=False, remote=remote)
        )
    except ActiveTurnToSettle as active:
        interrupted = active.turn_id
        await _settle_interrupted(ctx, repos, submission, interrupted, now)
        written = await repos.write(
            lambda conn: write_submission(
                conn, ctx, submission, now, dispatch=False, interrupted=interrupted, remote=remote
            )
        )
    written.record(repos, ctx)
    return written.replayed, written.interrupted


async def _remote_runtimes(ctx: HostContext, session: SessionRow | None) -> list[RuntimeIdentity]:
    """Runtimes attached to other replicas, for a submit no local link serves (SCALE-2).

    Read before the write (the write function runs on the writer thread and reads no
    presence). Empty on a single node, and without a query when a local link serves the
    Session the probe found.
    """
    if ctx.presence is None:
        return []
    if session is not None and (
        ctx.runtimes.link_for(session.workspace_id, session.agent_target_id, session.provider)
        is not None
    ):
        return []
    return await ctx.presence.identities()


async def _settle_interrupted(
    ctx: HostContext, repos: HostTransaction, submission: Submission, turn_id: str, now: int
) -> None:
    """Settle the Turn an ``interrupt`` delivery replaces and queue its ``interrupt_turn``.

    The replaced Turn settles ``canceled`` (``interrupted`` is reserved for delete and
    runtime loss, HOST-TURN-5). The write function locked the Session (root first) and found
    the Turn active in this transaction, so both are there.
    """
    ws, sid = submission.workspace_id, submission.session_id
    session = await repos.session_rows.lock_with_root(ws, sid)
    active = await repos.turns.get(ws, sid, turn_id)
    if session is None or active is None:
        raise RuntimeError(f"Turn {turn_id!r} vanished under its Session's lock")
    await lifecycle.settle(repos, session, active, "canceled", now)
    command_outbox.enqueue(repos, ctx, session, InterruptTurn(turn_id, InterruptReason.DELIVERY))


async def session_context(
    repos: HostTransaction, session: SessionRow, *, target: TargetRow | _Unread | None = UNREAD
) -> RuntimeSessionContext:
    """What a runtime needs to run the Session: target, launch, settings, catalog, resume.

    ``target`` is the Session's agent target when the caller read it in this transaction
    already (``None``: it has none or it is not registered); by default it is read here.
    """
    if isinstance(target, _Unread):
        target = None
        if session.agent_target_id:
            target = await repos.session_rows.target(session.workspace_id, session.agent_target_id)
    return runtime_session_context(session, target)


__all__: Sequence[str] = (
    "DELIVERIES",
    "MAX_CONTENT_CHARS",
    "MAX_SUBMIT_ID_CHARS",
    "RUNTIME_RETRY_SECONDS",
    "Submission",
    "SubmitResult",
    "check_replay",
    "persist_submission",
    "read_back",
    "restored_input",
    "runtime_unavailable",
    "send_input",
    "session_context",
    "user_message_id",
    "validate",
)
