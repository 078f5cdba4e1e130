"""``tutti serve host`` with one write transaction held open just before its commit.

Run as ``python -m tests.support.paused_host SIGNAL_FILE MODULE ORDINAL <tutti arguments>``
(for example ``... services.host.deletion.delete 1 serve host --port-file PORT``). Crash tests
use it to SIGKILL a Host *inside* a transaction instead of guessing when one is open.

The hook is installed by this test-only entry point, not by production code: it replaces the
transaction runner of ``services.host.repository.unit_of_work`` with one that counts the write
transactions whose command is defined in ``MODULE`` (``services.host.deletion.delete`` for
``DeleteSessions``, ``services.host.deletion.purge`` for the purge). When the command body of the
``ORDINAL``-th one has returned, it enlists one more participant
(``store.transactions.UnitOfWork.enlist``), which runs inside the open
transaction, after every write of the body and of the participants the body enlisted:

1. it counts sessions, tombstones and cleanup-outbox rows twice — through the transaction
   itself (its own uncommitted writes included) and through a separate connection (only what
   is committed);
2. it writes both counts to ``SIGNAL_FILE`` as JSON ``{"inside": {...}, "committed": {...}}``
   (written to a temporary name and renamed, so a reader never sees half of it);
3. it blocks forever, so the transaction never commits: the parent, having read the file,
   kills the process while the transaction is provably open.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import distinct, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from services.host.repository import unit_of_work
from services.host.repository.unit_of_work import HostTransaction
from store.models import ResourceCleanupOutbox, Session
from store.transactions import CommitHook, TransactionParticipant, TransactionRunner

Counts = dict[str, int]
ResultT = TypeVar("ResultT")


async def counts(reader: AsyncSession | AsyncConnection) -> Counts:
    """Sessions, distinct trees, tombstoned Sessions and cleanup rows as ``reader`` sees them."""

    async def scalar(statement: Any) -> int:
        return int((await reader.execute(statement)).scalar_one())

    return {
        "sessions": await scalar(select(func.count()).select_from(Session)),
        "trees": await scalar(select(func.count(distinct(Session.root_session_id)))),
        "tombstoned": await scalar(
            select(func.count()).select_from(Session).where(Session.deleted_at_unix_ms.is_not(None))
        ),
        "cleanup_rows": await scalar(select(func.count()).select_from(ResourceCleanupOutbox)),
    }


class PausingRunner(TransactionRunner[HostTransaction]):
    """A runner whose ``ordinal``-th write transaction of ``module`` never commits."""

    written = 0
    """Write transactions of the module's commands started so far (process-wide)."""
    module = ""
    signal_file = Path()
    ordinal = 0

    async def run(
        self,
        command: Callable[[HostTransaction], Awaitable[ResultT]],
        *,
        participants: Sequence[TransactionParticipant] = (),
        write: bool = True,
        before_commit: Callable[[HostTransaction], Awaitable[CommitHook | None]] | None = None,
    ) -> ResultT:
        if not write or getattr(command, "__module__", None) != PausingRunner.module:
            return await super().run(
                command, participants=participants, write=write, before_commit=before_commit
            )
        PausingRunner.written += 1
        if PausingRunner.written != PausingRunner.ordinal:
            return await super().run(
                command, participants=participants, before_commit=before_commit
            )

        async def paused(scope: HostTransaction) -> ResultT:
            result = await command(scope)
            scope.uow.enlist(self._hold_open)  # after everything the body enlisted
            return result

        return await super().run(paused, participants=participants, before_commit=before_commit)

    async def _hold_open(self, session: AsyncSession) -> None:
        inside = await counts(session)
        async with self._engine.connect() as other:
            committed = await counts(other)
        tmp = PausingRunner.signal_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inside": inside, "committed": committed}))
        tmp.replace(PausingRunner.signal_file)
        await asyncio.Event().wait()  # never set: the transaction stays open until the kill


def main() -> None:
    """Install the pause in ``argv[2]``, then run the tutti CLI with the remaining arguments."""
    signal_file, module_name, ordinal, *cli_args = sys.argv[1:]
    importlib.import_module(module_name)  # a mistyped module fails here, not silently
    PausingRunner.module = module_name
    PausingRunner.signal_file = Path(signal_file)
    PausingRunner.ordinal = int(ordinal)
    setattr(unit_of_work, "TransactionRunner", PausingRunner)  # noqa: B010 - test-only hook
    from tutti.cli import main as tutti_main

    sys.argv = ["tutti", *cli_args]
    tutti_main()


if __name__ == "__main__":
    main()
