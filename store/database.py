"""The async database handle a service process opens at start and closes at stop.

A service becomes ready only when its store answers and its schema is at the newest
migration: migrations run as a separate step (``tutti migrate``, a Kubernetes Job),
never implicitly by every replica.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from store.direct_reads import DirectReads
from store.direct_writes import DirectWrites
from store.engine import DEFAULT_SQLITE_WRITE_QUEUE_SECONDS, create_async_engine_for
from store.migrate import current, head
from store.transactions import finish_abandoned


class SchemaNotReady(RuntimeError):
    """The database is not migrated to the revision this build expects."""


class Database:
    """Owns one :class:`AsyncEngine`; use :meth:`start` / :meth:`stop` as server hooks."""

    def __init__(
        self,
        url: str,
        *,
        sqlite_write_queue_seconds: float = DEFAULT_SQLITE_WRITE_QUEUE_SECONDS,
        sqlite_group_commit: bool | None = None,
        sqlite_synchronous: str = "NORMAL",
    ) -> None:
        self.url = url
        self.sqlite_write_queue_seconds = sqlite_write_queue_seconds
        self.sqlite_group_commit = sqlite_group_commit
        self.sqlite_synchronous = sqlite_synchronous
        self._engine: AsyncEngine | None = None
        self._reads: DirectReads | None = None
        self._writes: DirectWrites | None = None

    @property
    def reads(self) -> DirectReads:
        """The hot-read connections (``store.direct_reads``); valid like :attr:`engine`."""
        if self._reads is None:
            raise RuntimeError("database not started")
        return self._reads

    @property
    def writes(self) -> DirectWrites:
        """The direct write connections (``store.direct_writes``); valid like :attr:`engine`."""
        if self._writes is None:
            raise RuntimeError("database not started")
        return self._writes

    @property
    def engine(self) -> AsyncEngine:
        """The engine; only valid between :meth:`start` and :meth:`stop`."""
        if self._engine is None:
            raise RuntimeError("database not started")
        return self._engine

    async def start(self) -> None:
        """Check the schema revision, then open the engine.

        Raises:
            SchemaNotReady: the schema is missing or at another revision.
        """
        expected = head()
        found = await asyncio.to_thread(current, self.url)
        if found != expected:
            raise SchemaNotReady(
                f"database schema is at {found or 'nothing'}, this build needs {expected}: "
                "run `tutti migrate` first"
            )
        self._engine = create_async_engine_for(
            self.url,
            sqlite_write_queue_seconds=self.sqlite_write_queue_seconds,
            sqlite_group_commit=self.sqlite_group_commit,
            sqlite_synchronous=self.sqlite_synchronous,
        )
        self._reads = DirectReads(self.url)
        self._writes = DirectWrites(
            self.url, self._engine, sqlite_synchronous=self.sqlite_synchronous
        )

    async def stop(self) -> None:
        """Let reads and commands of cancelled callers end, then close every connection."""
        if self._reads is not None:
            await self._reads.close()
            self._reads = None
        if self._writes is not None:
            await self._writes.close()
            self._writes = None
        if self._engine is not None:
            await finish_abandoned(self._engine)
            await self._engine.dispose()
            self._engine = None
