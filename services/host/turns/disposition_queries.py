"""Disposition queries: a missing acknowledgement is not a rejection (HOST-INT-6).

A delivered answer whose runtime sends no disposition within the window
(``interaction_disposition_query_seconds``), or whose link was lost, stays ``resolving``;
Host asks the runtime for the disposition of the exact (Turn, request) with a
``query_interaction_disposition`` command through the durable outbox (HOST-RT-5), and keeps
asking with backoff until an authoritative answer (:func:`interactions.apply_disposition`) or
confirmed session loss completes the operation.

The schedule is durable: the operation's ``next_attempt_at_unix_ms`` is set to the window
when its delivery is dispatched (``command_outbox``) and pushed back by every query, the
interval growing with the operation's age (doubling, up to :data:`MAX_QUERY_INTERVAL_MS`). A
restarted Host reads it back, and a (re)connected link makes the queries of the Sessions it
serves due at once and wakes the sweep, so an answer lost with a link is asked for again on
the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from services.host.context import HostContext
from services.host.repository.row_views import OperationRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import QueryInteractionDisposition
from services.host.runtime.registry import RuntimeLinkHandle
from services.host.turns import command_outbox

_log = logging.getLogger(__name__)

MAX_QUERY_INTERVAL_MS: Final = 10 * 60 * 1000
"""Longest wait between two queries of one operation."""

QUERY_BATCH: Final = 100
"""Most operations one sweep queries (the rest are due on the next sweep)."""


def next_query_at(operation: OperationRow, now: int, window_ms: int) -> int:
    """When to ask again: after the operation's age so far, at least the window, at most the cap.

    Queries at roughly 1, 2, 4, 8... windows after the delivery, derived from the durable
    ``created_at_unix_ms`` alone.
    """
    age = max(0, now - operation.created_at_unix_ms)
    return now + min(MAX_QUERY_INTERVAL_MS, max(window_ms, age))


async def send_due_queries(ctx: HostContext) -> int:
    """Queue a disposition query for every dispatched operation whose query is due.

    Each query is written in its own transaction with the operation's next query time, so a
    Host that stops meanwhile neither loses nor repeats the schedule; the outbox sends it to
    the link serving the Session after the commit (or to the next link that connects).

    Returns:
        How many queries were queued.
    """
    now = ctx.clock()

    async def due(repos: HostTransaction) -> list[tuple[str, str, str]]:
        rows = await repos.operations.query_due(now, QUERY_BATCH)
        return [(row.workspace_id, row.session_id, row.operation_id) for row in rows]

    sent = 0
    for key in await ctx.transact(due, write=False):

        async def query(repos: HostTransaction, key: tuple[str, str, str] = key) -> bool:
            return await _queue_query(repos, ctx, *key)

        sent += int(await ctx.transact(query))
    return sent


async def _queue_query(
    repos: HostTransaction, ctx: HostContext, workspace_id: str, session_id: str, operation_id: str
) -> bool:
    """Queue one query if the operation still waits for it.

    The Session is locked first, as a report applying a disposition locks it, so the
    operation read next is the committed one.
    """
    session = await repos.session_rows.get(workspace_id, session_id, lock=True)
    operation = await repos.operations.get(workspace_id, operation_id)
    now = ctx.clock()
    if session is None or operation is None or operation.state != "resolving":
        return False  # completed or released meanwhile
    due = operation.next_attempt_at_unix_ms
    if due is None or due > now:
        return False  # queried meanwhile
    # One open query per operation: an unanswered earlier one is replaced, not piled up.
    for row in await repos.commands.of_operation(
        workspace_id, session_id, operation_id, command_outbox.QUERY
    ):
        await repos.commands.delete(row)
    command = QueryInteractionDisposition(
        operation_id=operation_id, turn_id=operation.turn_id, request_id=operation.request_id
    )
    command_outbox.enqueue(repos, ctx, session, command, operation_id=operation_id)
    repos.operations.update(
        operation,
        next_attempt_at_unix_ms=next_query_at(operation, now, ctx.disposition_query_window_ms),
        updated_at_unix_ms=now,
    )
    return True


async def make_due_after_reconnect(ctx: HostContext, link: RuntimeLinkHandle) -> int:
    """A link (re)connected: make every resolving answer of the Sessions it serves due now.

    An answer delivered on a lost link (or before a Host restart) may have been applied with
    its disposition lost; the runtime's registry says what became of it. One write here; the
    background :class:`DispositionQuerier`, woken at once, sends the queries, so the link's
    first frames never wait behind them.

    Returns:
        How many operations were made due.
    """
    identity = link.identity

    async def make_due(repos: HostTransaction) -> int:
        return await repos.operations.make_due_for_link(
            workspaces=identity.workspaces,
            providers=identity.providers,
            target_ids=identity.target_ids,
            now=ctx.clock(),
        )

    count = await ctx.transact(make_due)
    if count:
        ctx.disposition_queries_due.set()
    return count


class DispositionQuerier:
    """Sends due disposition queries in the background while Host runs (a start/stop hook)."""

    def __init__(self, ctx: HostContext) -> None:
        self._ctx = ctx
        self._task: asyncio.Task[None] | None = None

    @property
    def poll_seconds(self) -> float:
        """How often due queries are looked for: a quarter window, within 50 ms and 5 s."""
        return min(5.0, max(0.05, self._ctx.interaction_disposition_query_seconds / 4))

    async def start(self) -> None:
        """Start the sweep loop."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the sweep loop (queued queries stay in the outbox)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        due = self._ctx.disposition_queries_due
        while True:
            # A reconnect wakes the sweep at once; otherwise it looks every poll interval.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(due.wait(), self.poll_seconds)
            due.clear()
            try:
                await send_due_queries(self._ctx)
            except Exception:  # noqa: BLE001 - the schedule is durable: retry next sweep
                _log.warning("disposition query sweep failed", exc_info=True)
