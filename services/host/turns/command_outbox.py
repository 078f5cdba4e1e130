"""Commands to runtimes through the durable outbox (HOST-RT-1, HOST-INT-3).

A command is written as a ``runtime_command_outbox`` row in the same transaction as the
fact that causes it (a persisted Turn, a stop, a claimed interaction response), then
dispatched after the commit to the link that serves the Session. Rows stay ``pending``
until dispatched and ``dispatched`` until the runtime acknowledges them; a link that
(re)connects receives every unacknowledged command of the Sessions it serves, so a
command survives a Host restart and a runtime reconnect (commands are idempotent by
``command_id``). With several replicas (SCALE-2, ADR 0042) a commit where no local link serves
the Session publishes a wake-up instead; the replica holding the link dispatches from the
outbox (``services.host.runtime.wakeups``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.host.context import HostContext
from services.host.repository import command_acks, outbox_writes
from services.host.repository.command_rows import SessionRoute, pending_values
from services.host.repository.row_views import CommandRow, SessionRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import RuntimeCommandValue
from services.host.runtime.registry import CommandAck, OutboundCommand, RuntimeLinkHandle
from store.direct_writes import WriteConnection

_log = logging.getLogger(__name__)

DELIVER = command_acks.DELIVER
"""Kind of the command that delivers a response operation's answer."""

QUERY = "query_interaction_disposition"
"""Kind of the command that asks for a delivered answer's disposition (HOST-INT-6)."""


def enqueue(
    repos: HostTransaction,
    ctx: HostContext,
    session: SessionRow,
    command: RuntimeCommandValue,
    *,
    operation_id: str | None = None,
) -> str:
    """Write a command row in the open transaction; it is sent after the commit.

    Args:
        repos: The open transaction.
        ctx: Host dependencies (clock, registry, the wire's command codec).
        session: The Session the command acts on.
        command: The command; stored as the wire encodes it (``ctx.command_codec``).
        operation_id: The response operation the command delivers, when there is one.

    Returns:
        The new command id.
    """
    command_id = f"cmd-{uuid.uuid4()}"
    repos.commands.add_pending(
        (session.workspace_id, session.session_id),
        command_id,
        ctx.command_codec.encode(command),
        operation_id=operation_id,
        now=ctx.clock(),
    )
    enlist_dispatch(repos, ctx, session)
    return command_id


def enlist_dispatch(repos: HostTransaction, ctx: HostContext, session: SessionRow) -> None:
    """Dispatch the Session's pending commands in the open transaction, after its body.

    :func:`enqueue` calls it; so does a transaction whose rows a write function wrote on
    its connection (:func:`enqueue_written` without a link). Once per Session and
    transaction: the participant reads all of the Session's pending rows.
    """
    key = (session.workspace_id, session.session_id)
    if key not in repos.dispatching:
        repos.dispatching.add(key)
        target = (session.agent_target_id, session.provider)

        async def dispatch_in_transaction(_db: object) -> None:
            await _dispatch_with_commit(repos, ctx, key, target)

        repos.uow.enlist(dispatch_in_transaction)


@dataclass(frozen=True)
class Dispatched:
    """Commands a write function marked ``dispatched``, for their link after the commit."""

    link: RuntimeLinkHandle
    commands: tuple[OutboundCommand, ...]

    def send(self) -> None:
        """Hand the commands to the link, in order (only after the commit)."""
        for command in self.commands:
            self.link.send(command)


def enqueue_written(
    conn: WriteConnection,
    ctx: HostContext,
    session: SessionRow,
    command: RuntimeCommandValue,
    now: int,
    *,
    link: RuntimeLinkHandle | None,
    has_pending: bool = True,
) -> Dispatched | None:
    """Write a command row in an open write function (``store.direct_writes``, ADR 0034).

    With ``link``, the link serving the Session now, the command is dispatched in this commit
    exactly as :func:`enqueue`'s participant does it: the Session's older ``pending`` rows
    (locked, oldest first) become ``dispatched`` and the new row is written ``dispatched``;
    the caller sends them after the commit (:meth:`Dispatched.send`). Without one, the row is
    written ``pending`` and the caller dispatches it (:func:`enlist_dispatch` in an ORM
    transaction). ``has_pending=False`` says the transaction found no ``pending`` row of the
    Session after taking its lock, so none is read again. Runs on the writer thread: nothing
    here touches the event loop.
    """
    workspace_id, session_id = session.workspace_id, session.session_id
    command_id = f"cmd-{uuid.uuid4()}"
    encoded = ctx.command_codec.encode(command)
    values = pending_values((workspace_id, session_id), command_id, encoded, None, now)
    if link is None:
        outbox_writes.insert_command(conn, values)
        return None
    older = outbox_writes.pending_of_session(conn, workspace_id, session_id) if has_pending else ()
    sends = [_mark_written(conn, ctx, row, now) for row in older]
    values.update(state="dispatched", attempts=1)
    outbox_writes.insert_command(conn, values)
    sends.append(
        OutboundCommand(
            command_id=command_id,
            workspace_id=workspace_id,
            session_id=session_id,
            issued_at_unix_ms=now,
            kind=encoded[0],
            payload=json.loads(encoded[1]),
        )
    )
    return Dispatched(link, tuple(sends))


def _mark_written(
    conn: WriteConnection, ctx: HostContext, row: CommandRow, now: int
) -> OutboundCommand:
    """:func:`_mark_dispatched` in a write function."""
    outbox_writes.mark_dispatched(conn, row.id, row.attempts + 1, now)
    if row.operation_id is not None and row.command_kind == DELIVER:
        operation = outbox_writes.operation(conn, row.workspace_id, row.operation_id)
        if operation is not None:
            moved = _operation_dispatched(ctx, operation.state, operation.attempts, now)
            if moved is not None:
                outbox_writes.set_operation(
                    conn,
                    row.workspace_id,
                    row.operation_id,
                    state=moved.state,
                    attempts=moved.attempts,
                    next_attempt_at_unix_ms=moved.next_attempt_at_unix_ms,
                    now=now,
                )
    return _outbound(row)


@dataclass(frozen=True)
class _OperationMove:
    state: str
    attempts: int
    next_attempt_at_unix_ms: int


def _operation_dispatched(
    ctx: HostContext, state: str, attempts: int, now: int
) -> _OperationMove | None:
    """A response operation once its delivery is dispatched (``None``: it stays as it is).

    HOST-INT-3: the operation is ``pending`` until dispatched, then ``resolving``; with no
    disposition by ``next_attempt_at_unix_ms`` its disposition is queried (HOST-INT-6).
    """
    if state == "completed":
        return None
    next_attempt = now + ctx.disposition_query_window_ms
    if state == "pending":
        return _OperationMove("resolving", attempts + 1, next_attempt)
    return _OperationMove(state, attempts, next_attempt)


async def enqueue_many(
    repos: HostTransaction,
    ctx: HostContext,
    routes: Sequence[SessionRoute],
    command: RuntimeCommandValue,
    *,
    now: int | None = None,
) -> list[str]:
    """Write one command row per Session in the open transaction (set-based dispatch).

    Like :func:`enqueue` for many Sessions at once (a delete's ``release_session`` for a
    whole tree): the rows are inserted by one bulk statement, after the rows staged before
    them, and one participant dispatches every Session a connected link serves with one read
    of their pending rows, instead of one participant and one read per Session.

    Args:
        repos: The open transaction.
        ctx: Host dependencies (clock, registry, the wire's command codec).
        routes: The Sessions, one command each.
        command: The command (the same for every Session).
        now: The time of the causing fact (default: the clock).

    Returns:
        The new command ids, in ``routes`` order.
    """
    if not routes:
        return []
    command_ids = [f"cmd-{uuid.uuid4()}" for _ in routes]
    await repos.commands.insert_pending(
        [(route.workspace_id, route.session_id) for route in routes],
        command_ids,
        ctx.command_codec.encode(command),
        now=ctx.clock() if now is None else now,
    )
    # Sessions already dispatched by this transaction (an enqueue() of theirs ran) are left
    # to that participant, which reads all of their pending rows, these included.
    fresh = [
        route for route in routes if (route.workspace_id, route.session_id) not in repos.dispatching
    ]
    if fresh:
        repos.dispatching.update((route.workspace_id, route.session_id) for route in fresh)

        async def dispatch_in_transaction(_db: object) -> None:
            await _dispatch_many_with_commit(repos, ctx, fresh)

        repos.uow.enlist(dispatch_in_transaction)
    return command_ids


async def dispatch_unserved(ctx: HostContext, routes: Sequence[SessionRoute]) -> None:
    """After a commit that left these Sessions' commands ``pending`` (no local link served them).

    With several replicas (SCALE-2) the wake-up reaches the replica holding a serving link
    (this one too, should a link connect here meanwhile), which dispatches from the outbox;
    on a single node the local dispatch looks again, so a link that connected meanwhile still
    gets them.
    """
    if ctx.command_wakeups is not None:
        await ctx.command_wakeups.wake(routes)
    else:
        await dispatch_routes(ctx, routes)


def _by_link(
    ctx: HostContext, routes: Sequence[SessionRoute]
) -> tuple[dict[RuntimeLinkHandle, list[SessionRoute]], list[SessionRoute]]:
    served: dict[RuntimeLinkHandle, list[SessionRoute]] = {}
    unserved: list[SessionRoute] = []
    for route in routes:
        link = ctx.runtimes.link_for(route.workspace_id, route.agent_target_id, route.provider)
        if link is None:
            unserved.append(route)
        else:
            served.setdefault(link, []).append(route)
    return served, unserved


async def _mark_routes(
    repos: HostTransaction,
    ctx: HostContext,
    served: Mapping[RuntimeLinkHandle, Sequence[SessionRoute]],
) -> list[tuple[RuntimeLinkHandle, OutboundCommand]]:
    sends: list[tuple[RuntimeLinkHandle, OutboundCommand]] = []
    for link, group in served.items():
        by_workspace: dict[str, list[str]] = {}
        for route in group:
            by_workspace.setdefault(route.workspace_id, []).append(route.session_id)
        for workspace_id, session_ids in by_workspace.items():
            for row in await repos.commands.pending_of(workspace_id, session_ids):
                sends.append((link, await _mark_dispatched(repos, ctx, row)))
    return sends


async def _dispatch_many_with_commit(
    repos: HostTransaction, ctx: HostContext, routes: Sequence[SessionRoute]
) -> None:
    """:func:`_dispatch_with_commit` for many Sessions: one read per link and workspace."""
    served, unserved = _by_link(ctx, routes)
    sends = await _mark_routes(repos, ctx, served)
    if sends:

        async def send_after_commit() -> None:
            for link, command in sends:
                link.send(command)

        repos.uow.after_commit(send_after_commit)
    if unserved:

        async def dispatch_after_commit() -> None:
            await dispatch_unserved(ctx, unserved)

        repos.uow.after_commit(dispatch_after_commit)


async def dispatch_routes(ctx: HostContext, routes: Sequence[SessionRoute]) -> int:
    """Send these Sessions' pending commands to the links serving them now.

    Checks the registry first, so Sessions no runtime serves cost no transaction (a link
    that connects later receives the rows through :func:`resend_unacknowledged`).

    Returns:
        How many commands were handed to a link.
    """
    served, _ = _by_link(ctx, routes)
    if not served:
        return 0

    async def run(repos: HostTransaction) -> list[tuple[RuntimeLinkHandle, OutboundCommand]]:
        return await _mark_routes(repos, ctx, served)

    sends = await ctx.transact(run)
    for link, command in sends:
        link.send(command)
    return len(sends)


async def _dispatch_with_commit(
    repos: HostTransaction,
    ctx: HostContext,
    key: tuple[str, str],
    target: tuple[str | None, str],
) -> None:
    """Mark the Session's pending commands dispatched in the transaction that wrote them.

    Runs as a participant, after the command body: when a link serves the Session now, its
    pending rows (the new ones and any an earlier ``failed`` acknowledgement put back) become
    ``dispatched`` in this commit and are sent after it — one write transaction fewer than a
    separate post-commit dispatch. The retry contract is unchanged (ADR 0013): a row commits
    either ``pending`` or ``dispatched``, both are unacknowledged, and a (re)connecting link
    receives both; nothing is sent unless the commit succeeded. Without a link the rows stay
    ``pending`` and the post-commit :func:`dispatch_unserved` wakes the replica that
    holds a link, or looks again here (a link that connected meanwhile still gets them).
    """
    workspace_id, session_id = key
    link = ctx.runtimes.link_for(workspace_id, *target)
    if link is None:
        route = SessionRoute(workspace_id, session_id, *target)

        async def dispatch_after_commit() -> None:
            await dispatch_unserved(ctx, [route])

        repos.uow.after_commit(dispatch_after_commit)
        return
    rows = await repos.commands.pending_of(workspace_id, [session_id])
    commands = [await _mark_dispatched(repos, ctx, row) for row in rows]

    async def send_after_commit() -> None:
        for command in commands:
            link.send(command)

    repos.uow.after_commit(send_after_commit)


def _outbound(row: CommandRow) -> OutboundCommand:
    return OutboundCommand(
        command_id=row.command_id,
        workspace_id=row.workspace_id,
        session_id=row.session_id,
        issued_at_unix_ms=row.created_at_unix_ms,
        kind=row.command_kind,
        payload=json.loads(row.payload_json),
    )


async def dispatch_session(ctx: HostContext, workspace_id: str, session_id: str) -> int:
    """Send the Session's pending commands to the link that serves it.

    Returns:
        How many commands were handed to a link (0 when no runtime serves the Session).
    """

    async def run(repos: HostTransaction) -> list[tuple[RuntimeLinkHandle, OutboundCommand]]:
        session = await repos.session_rows.get(workspace_id, session_id)
        if session is None:
            return []
        link = ctx.runtimes.link_for(workspace_id, session.agent_target_id, session.provider)
        if link is None:
            return []
        rows = await repos.commands.pending_of(workspace_id, [session_id])
        return [(link, await _mark_dispatched(repos, ctx, row)) for row in rows]

    sent = await ctx.transact(run)
    for link, command in sent:
        link.send(command)
    return len(sent)


async def resend_unacknowledged(ctx: HostContext, link: RuntimeLinkHandle) -> int:
    """Give a (re)connected link every unacknowledged command of the Sessions it serves."""

    async def run(repos: HostTransaction) -> list[OutboundCommand]:
        served: list[int] = []
        sessions: dict[tuple[str, str], bool] = {}
        for row in await repos.commands.unacknowledged():
            key = (row.workspace_id, row.session_id)
            if key not in sessions:
                session = await repos.session_rows.get(*key)
                sessions[key] = session is not None and link.identity.serves(
                    session.workspace_id, session.agent_target_id, session.provider
                )
            if sessions[key]:
                served.append(row.id)
        # Locked and re-checked: a row acknowledged or withdrawn meanwhile is not re-sent.
        locked = await repos.commands.lock_open(served)
        return [await _mark_dispatched(repos, ctx, row) for row in locked]

    commands = await ctx.transact(run)
    for command in commands:
        link.send(command)
    return len(commands)


async def _mark_dispatched(
    repos: HostTransaction, ctx: HostContext, row: CommandRow
) -> OutboundCommand:
    now = ctx.clock()
    repos.commands.update(
        row, state="dispatched", attempts=row.attempts + 1, updated_at_unix_ms=now
    )
    if row.operation_id is not None and row.command_kind == DELIVER:
        operation = await repos.operations.get(row.workspace_id, row.operation_id)
        if operation is not None:
            moved = _operation_dispatched(ctx, operation.state, operation.attempts, now)
            if moved is not None:
                repos.operations.update(
                    operation,
                    state=moved.state,
                    attempts=moved.attempts,
                    next_attempt_at_unix_ms=moved.next_attempt_at_unix_ms,
                    updated_at_unix_ms=now,
                )
    return _outbound(row)


async def record_ack(ctx: HostContext, ack: CommandAck) -> command_acks.AckOutcome:
    """Record a runtime's acknowledgement on its outbox row, in a transaction of its own.

    ``accepted`` completes the row; ``rejected`` (an explicit provider rejection) fails it
    for good; ``failed`` puts it back to ``pending`` so the next dispatch retries it.

    Retention: a completed or failed row is deleted at once, unless it delivers a response
    operation that has not completed — a runtime ``pending`` disposition may still put that
    row back to ``pending`` (HOST-INT-3). Such rows are deleted in bounded batches by later
    acknowledgements once their operation completes. A rejected awaited command
    (:data:`AWAITED_COMMAND_KINDS`) stays ``failed`` until its waiter settles it
    (:func:`withdraw_awaited`). A repeated acknowledgement of a deleted row finds nothing and
    is ignored, exactly like one of a completed row. The row is read under its lock, so an
    acknowledgement and a withdrawal of the same command serialize.

    The transaction is one direct write (``repository.command_acks``, ADR 0034): it changes
    no activity, so it needs no activity outbox.

    Raises:
        domainerrors.Unavailable, domainerrors.Aborted: the store was busy or aborted the
            transaction; nothing committed.
    """
    (outcome,) = await record_acks(ctx, [ack])
    return outcome


async def record_acks(
    ctx: HostContext, acks: Sequence[CommandAck]
) -> list[command_acks.AckOutcome]:
    """:func:`record_ack` for several acknowledgements, in order, in one transaction.

    Each is recorded exactly as alone (a later one sees the earlier ones' changes); the
    transaction commits all of them or none.

    Raises:
        domainerrors.Unavailable, domainerrors.Aborted: as :func:`record_ack`; nothing
            committed.
    """
    now = ctx.clock()

    def record_all(conn: WriteConnection) -> list[command_acks.AckOutcome]:
        return [
            command_acks.record_ack(
                conn, ack.command_id, ack.status, ack.reason or ack.message or None, now
            )
            for ack in acks
        ]

    outcomes = await ctx.write(record_all)
    for ack, outcome in zip(acks, outcomes, strict=True):
        if not outcome.found:
            _log.info("acknowledgement for unknown command %s", ack.command_id)
        elif outcome.applied and outcome.state == "failed":
            _log.info("runtime rejected command %s: %s", ack.command_id, outcome.error)
    return outcomes


@dataclass(frozen=True)
class Withdrawal:
    """How an awaited command ended once its waiter gave up on the acknowledgement.

    Attributes:
        outcome: ``accepted`` (an acceptance committed first), ``rejected`` (a rejection
            committed first) or ``withdrawn`` (no verdict: the row is deleted and the command
            is never sent again).
        in_flight: For ``withdrawn``: the command had been handed to a link and no verdict
            came back, so a runtime may have received it.
        detail: The runtime's reason of a rejection.
    """

    outcome: str
    in_flight: bool = False
    detail: str | None = None


async def withdraw_awaited(repos: HostTransaction, command_id: str) -> Withdrawal:
    """Settle an awaited command whose acknowledgement did not come in time (or the link closed).

    Runs against a racing acknowledgement: both lock the row (Postgres) or hold the write lock
    (SQLite), so exactly one commits first. An acceptance deletes the row, a rejection of an
    awaited command keeps it ``failed`` (:func:`record_ack`), so the row left behind says
    which verdict won; an unacknowledged row is deleted here, and a later acknowledgement finds
    nothing and is ignored. Only for commands without a response operation.
    """
    row = await repos.commands.by_command_id(command_id, lock=True)
    if row is None:
        return Withdrawal("accepted")
    await repos.commands.delete(row)
    if row.state == "completed":
        return Withdrawal("accepted")
    if row.state == "failed":
        return Withdrawal("rejected", detail=row.last_error)
    return Withdrawal("withdrawn", in_flight=row.state == "dispatched")
