"""What every Host component shares inside one host process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from services.host.activity.broker import CommittedBatch
from services.host.activity.feed import ActivityFeed
from services.host.model.mutation_lanes import MutationLanes
from services.host.repository import unit_of_work
from services.host.repository.changes import ChangeSet, ResolvedState
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import CommandCodec
from services.host.runtime.registry import RuntimeRegistry
from services.host.runtime.settings_port import DetachedRuntimeSettings, RuntimeSettingsPort
from services.host.turns.workspace_index import WorkspaceIndexFactory, local_workspace_index
from store.database import Database
from store.direct_reads import ReadConnection
from store.direct_writes import WriteConnection

if TYPE_CHECKING:
    from services.host.runtime.presence import ReplicaPresence
    from services.host.runtime.wakeups import CommandWakeups

ResultT = TypeVar("ResultT")


class ActivityWrite(Protocol):
    """The result of a write function that changed activity (``HostContext.write_activity``)."""

    def activity(self) -> tuple[ChangeSet, ResolvedState]:
        """What it changed, and the state its events report."""


ActivityWriteT = TypeVar("ActivityWriteT", bound=ActivityWrite)


def wall_clock_ms() -> int:
    """Current Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


@dataclass
class HostContext:
    """Dependencies of the Host domain, built once by ``services.host.app``.

    Attributes:
        database: The canonical store (started by the server's start hook).
        command_codec: Encodes runtime commands for the outbox (the wire's
            ``ProtoCommandCodec``).
        clock: Unix-millisecond clock; tests inject a fake.
        lanes: Per-Session mutation lanes (HOST-LANE-1).
        runtimes: Connected runtimes and their links (HOST-RT-1).
        runtime_loss_grace_seconds: How long a disconnected runtime may stay away before
            its Turns are interrupted (``TUTTI_RUNTIME_LOSS_GRACE_SECONDS``).
        runtime_command_timeout_seconds: How long an awaited runtime command may take.
        interaction_disposition_query_seconds: How long a delivered Interaction response
            may go without a disposition before Host queries it (HOST-INT-6); later queries
            back off from it.
        disposition_queries_due: Set when disposition queries became due outside the
            schedule (a link connected); wakes the background querier (HOST-INT-6).
        runtime_settings: Applies persisted Session settings to a live runtime (HOST-SES-6);
            ``app.build`` installs the runtime link's ``LinkedRuntimeSettings`` in place of
            the detached default.
        activity: The activity feed: durable event log, live and delta lanes, pruning
            (HOST-OBS-1/2, HOST-RT-2). The default records no events (no codec);
            ``app.build`` passes the wire codec.
        workspace_index: Builds the workspace file-index port of a root, asked by the
            ``@`` menu and by send-time mention resolution (HOST-MENT-1, HOST-MENT-4); the
            local file system unless ``app.build`` is given another (tests).
        project_removal_max_rounds: Rounds ``RemoveProject`` makes before it fails
            ``STALE_DELETE_PLAN`` (``TUTTI_PROJECT_REMOVAL_MAX_ROUNDS``, HOST-PROJ-1).
        presence: Runtimes attached to every replica (SCALE-2); ``None`` on a single node
            (no shared bus), where the registry alone decides.
        command_wakeups: Cross-replica command delivery and ack waits (SCALE-2); ``None``
            on a single node.
    """

    database: Database
    command_codec: CommandCodec
    clock: Callable[[], int] = wall_clock_ms
    lanes: MutationLanes = field(default_factory=MutationLanes)
    runtimes: RuntimeRegistry = field(default_factory=RuntimeRegistry)
    runtime_loss_grace_seconds: float = 30.0
    runtime_command_timeout_seconds: float = 10.0
    interaction_disposition_query_seconds: float = 30.0
    disposition_queries_due: asyncio.Event = field(default_factory=asyncio.Event)
    runtime_settings: RuntimeSettingsPort = field(default_factory=DetachedRuntimeSettings)
    activity: ActivityFeed = field(default_factory=lambda: ActivityFeed(wall_clock_ms))
    workspace_index: WorkspaceIndexFactory = local_workspace_index
    project_removal_max_rounds: int = 5
    presence: ReplicaPresence | None = None
    command_wakeups: CommandWakeups | None = None

    @property
    def disposition_query_window_ms(self) -> int:
        """``interaction_disposition_query_seconds`` in milliseconds (at least 1)."""
        return max(1, round(self.interaction_disposition_query_seconds * 1000))

    async def transact(
        self, command: Callable[[HostTransaction], Awaitable[ResultT]], *, write: bool = True
    ) -> ResultT:
        """Run a Host command in one transaction with the activity outbox (HOST-OBS-1).

        The events describing what ``command`` changed are appended in its transaction,
        after it and its participants ran, and published after the commit
        (``services.host.repository.unit_of_work.run``).
        """
        return await unit_of_work.run(self.database, command, write=write, outbox=self.activity.log)

    async def write(self, write: Callable[[WriteConnection], ResultT]) -> ResultT:
        """Run a synchronous write transaction that changes no activity, in one thread hop.

        For small, hot transactions whose rows are not in the activity feed (a command's
        acknowledgement, ``repository.command_acks``): ``write`` runs on a store writer
        thread (``store.direct_writes``) in the process's SQLite write line, and commits. A
        transaction that changes Sessions, Turns, Messages or Interactions goes through
        :meth:`transact`, whose activity outbox appends their events.
        """
        return await self.database.writes.run(write)

    async def write_activity(
        self, write: Callable[[WriteConnection], ActivityWriteT]
    ) -> ActivityWriteT:
        """Run a synchronous write transaction that changes activity, in one thread hop.

        Like :meth:`write`, and last in the same transaction, on the same thread, the
        activity outbox appends the events of what ``write`` reports it changed
        (``ActivityLog.append_resolved``: the state it wrote, nothing read); they are
        published after the commit, before the caller's own post-commit steps, as
        :meth:`transact` does (HOST-OBS-1, ADR 0034).
        """
        result, _ = await self._write_activity(write, None)
        return result

    async def write_activity_then_read(
        self,
        write: Callable[[WriteConnection], ActivityWriteT],
        read: Callable[[ReadConnection], ResultT],
    ) -> tuple[ActivityWriteT, ResultT | None]:
        """:meth:`write_activity`, then ``read`` what committed, in the same thread hop.

        The read runs on the writer's connection after the commit (``DirectWrites.
        run_then_read``); ``None`` when the store failed that read, not the write.
        """
        return await self._write_activity(write, read)

    async def _write_activity(
        self,
        write: Callable[[WriteConnection], ActivityWriteT],
        read: Callable[[ReadConnection], ResultT] | None,
    ) -> tuple[ActivityWriteT, ResultT | None]:
        log = self.activity.log
        writes = self.database.writes
        if log is None:
            if read is None:
                return await writes.run(write), None
            return await writes.run_then_read(write, read)

        def write_and_append(conn: WriteConnection) -> tuple[ActivityWriteT, list[CommittedBatch]]:
            result = write(conn)
            changes, state = result.activity()
            return result, log.append_resolved(conn, changes, state)

        found: ResultT | None = None
        if read is None:
            (result, batches) = await writes.run(write_and_append)
        else:
            (result, batches), found = await writes.run_then_read(write_and_append, read)
        log.publish(batches)
        return result, found

    async def read(
        self, read: Callable[[ReadConnection], ResultT], *, one_statement: bool = False
    ) -> ResultT:
        """Run a synchronous hot read (``repository.hot_reads``) in one read transaction.

        The read runs on a store read thread (``store.direct_reads``): one event-loop hop for
        the whole read. A read of exactly one statement says so (``one_statement``) and runs
        in autocommit, its own snapshot without ``BEGIN``/``COMMIT`` (ADR 0033).
        """
        return await self.database.reads.run(read, one_statement=one_statement)
