"""Engines for the canonical store: SQLite (default) and Postgres through psycopg 3 (STORE-1).

Settings-free: callers pass a database URL (from their own settings object). Accepted forms:
``sqlite:///path``, ``sqlite+pysqlite:///path``, ``sqlite+aiosqlite:///path``,
``postgresql://…``, ``postgres://…``, ``postgresql+psycopg://…`` and ``postgresql+psycopg_async://…``.
:func:`sync_url` and :func:`async_url` map any of them to the driver each engine kind uses.

Every SQLite connection gets WAL journal mode, ``foreign_keys=ON`` and a busy timeout. SQLite
transactions are begun explicitly by SQLAlchemy (the driver's own implicit transaction handling is
switched off), so transactional DDL, savepoints and ``BEGIN IMMEDIATE`` for write transactions
work as documented (see :data:`SQLITE_BEGIN_OPTION`).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from store.aiosqlite_one_hop import one_hop_dbapi
from store.write_queue import SqliteWriteSlotTimeout, WriteQueue

__all__ = [
    "DEFAULT_SQLITE_BUSY_TIMEOUT_MS",
    "DEFAULT_SQLITE_WRITE_QUEUE_DEPTH",
    "DEFAULT_SQLITE_WRITE_QUEUE_SECONDS",
    "SQLITE_BEGIN_OPTION",
    "SqliteWriteSlotTimeout",
    "async_url",
    "backend_name",
    "create_async_engine_for",
    "create_sync_engine_for",
    "sqlite_write_queue",
    "sqlite_write_slot",
    "sync_url",
]

DEFAULT_SQLITE_BUSY_TIMEOUT_MS: Final = 5_000
"""How long a SQLite connection waits for a lock before failing with ``database is locked``."""

DEFAULT_SQLITE_WRITE_QUEUE_SECONDS: Final = 30.0
"""How long a write transaction of this process may wait in line for the SQLite write slot.

Longer than the busy timeout on purpose: the queue is first come, first served, so a burst
(hundreds of concurrent writes from one machine) drains in order instead of failing after
5 s; only a wait past this bound, or a line longer than
:data:`DEFAULT_SQLITE_WRITE_QUEUE_DEPTH`, is refused (``STORE_BUSY`` with ``RetryInfo``)."""

DEFAULT_SQLITE_WRITE_QUEUE_DEPTH: Final = 10_000
"""Writers that may wait in line at once; the next one is refused at once instead of queueing
for longer than anyone would wait."""

SQLITE_BEGIN_OPTION: Final = "store_sqlite_begin"
"""Execution option choosing how a SQLite transaction begins: ``"DEFERRED"`` (default) or
``"IMMEDIATE"``. A read-then-write transaction should begin ``IMMEDIATE`` so it takes the write
lock up front (and waits on the busy timeout) instead of failing at its first write when another
writer committed after its read snapshot. Ignored on Postgres."""

_SQLITE_BEGIN_MODES: Final = frozenset({"DEFERRED", "IMMEDIATE", "EXCLUSIVE"})


def _parse(url: str | URL) -> URL:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgres":  # Heroku-style alias
        parsed = parsed.set(drivername="postgresql")
    elif backend not in {"sqlite", "postgresql"}:
        raise ValueError(f"unsupported database backend {backend!r}: use sqlite or postgresql")
    return parsed


def backend_name(url: str | URL) -> str:
    """Return ``"sqlite"`` or ``"postgresql"`` for a database URL.

    Raises:
        ValueError: the URL names another backend.
    """
    return _parse(url).get_backend_name()


def sync_url(url: str | URL) -> str:
    """Return ``url`` with the synchronous driver of its backend (pysqlite or psycopg).

    Raises:
        ValueError: the URL names an unsupported backend.
    """
    parsed = _parse(url)
    driver = "sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def async_url(url: str | URL) -> str:
    """Return ``url`` with the asyncio driver of its backend (aiosqlite or psycopg).

    Raises:
        ValueError: the URL names an unsupported backend.
    """
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        driver = "sqlite+aiosqlite"
    else:
        # psycopg 3 serves both; create_async_engine picks its asyncio implementation.
        driver = "postgresql+psycopg"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


_WRITE_GATES: weakref.WeakKeyDictionary[Engine, WriteQueue] = weakref.WeakKeyDictionary()
"""The write line (``store.write_queue``) of every async SQLite engine, by its sync engine."""


def sqlite_write_queue(engine: AsyncEngine) -> WriteQueue | None:
    """The write line of a SQLite ``engine`` in this process; ``None`` on Postgres."""
    return _WRITE_GATES.get(engine.sync_engine)


@asynccontextmanager
async def sqlite_write_slot(engine: AsyncEngine) -> AsyncIterator[None]:
    """Hold this process's SQLite writer alone (a no-op on Postgres).

    For write transactions that begin their own ``BEGIN IMMEDIATE`` (maintenance, the
    reference stores, compaction): they wait in the same line as every other writer of this
    process instead of polling SQLite's lock. ``TransactionRunner`` writes join group commits
    instead (``store.write_queue``). Holding it while already holding it on the same engine
    would wait for itself: never nest write transactions.

    Raises:
        SqliteWriteSlotTimeout: the slot did not come free within the queue timeout, or the
            queue already holds its maximum of waiting writers.
    """
    queue = _WRITE_GATES.get(engine.sync_engine)
    if queue is None:
        yield
        return
    async with queue.exclusive():
        yield


SQLITE_SYNCHRONOUS_MODES: Final = frozenset({"NORMAL", "FULL"})
"""Accepted ``PRAGMA synchronous`` settings (WAL mode): ``NORMAL`` keeps every commit atomic
and loses at most the newest commits on a power loss; ``FULL`` also makes every acknowledged
commit survive one, at an ``fsync`` per commit (shared by a group commit)."""


def _install_sqlite_listeners(
    engine: Engine, busy_timeout_ms: int, synchronous: str = "NORMAL"
) -> None:
    """Configure every new SQLite DBAPI connection and take over BEGIN from the driver."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        # Stop the driver from issuing its own BEGIN/COMMIT; SQLAlchemy's "begin" event below
        # starts transactions instead (the documented pysqlite/aiosqlite recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # In WAL mode NORMAL keeps every commit atomic; a power loss can only lose the
            # newest commits (the state before them), never tear one (STORE-3). FULL also
            # keeps every acknowledged commit (ADR 0025).
            cursor.execute(f"PRAGMA synchronous={synchronous}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = str(connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED"))
        if mode.upper() not in _SQLITE_BEGIN_MODES:
            raise ValueError(f"{SQLITE_BEGIN_OPTION} must be one of {sorted(_SQLITE_BEGIN_MODES)}")
        connection.exec_driver_sql(f"BEGIN {mode.upper()}")


def create_sync_engine_for(
    url: str | URL,
    *,
    echo: bool = False,
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    **engine_kwargs: Any,
) -> Engine:
    """Create a configured synchronous engine (used by migrations, tests and tooling).

    Args:
        url: any accepted database URL; its driver is normalized with :func:`sync_url`.
        echo: log SQL statements.
        sqlite_busy_timeout_ms: SQLite lock wait before ``database is locked``.
        **engine_kwargs: passed to :func:`sqlalchemy.create_engine` (pool sizing and the like).

    Returns:
        The engine. The caller disposes it.
    """
    normalized = sync_url(url)
    if backend_name(normalized) == "sqlite":
        engine = create_engine(normalized, echo=echo, **engine_kwargs)
        _install_sqlite_listeners(engine, sqlite_busy_timeout_ms)
        return engine
    engine_kwargs.setdefault("pool_pre_ping", True)
    return create_engine(normalized, echo=echo, **engine_kwargs)


def create_async_engine_for(
    url: str | URL,
    *,
    echo: bool = False,
    sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
    sqlite_write_queue_seconds: float = DEFAULT_SQLITE_WRITE_QUEUE_SECONDS,
    sqlite_write_queue_depth: int = DEFAULT_SQLITE_WRITE_QUEUE_DEPTH,
    sqlite_group_commit: bool | None = None,
    sqlite_synchronous: str = "NORMAL",
    **engine_kwargs: Any,
) -> AsyncEngine:
    """Create a configured asyncio engine (used by the services).

    Args:
        url: any accepted database URL; its driver is normalized with :func:`async_url`.
        echo: log SQL statements.
        sqlite_busy_timeout_ms: SQLite lock wait before ``database is locked`` (another
            process holding the write lock).
        sqlite_write_queue_seconds: how long a write waits in this process's write queue.
        sqlite_write_queue_depth: how many writes may wait in that queue at once.
        sqlite_group_commit: concurrent ``TransactionRunner`` writes share commits
            (``store.write_queue``); off, each commits alone. ``None`` (the default): on
            exactly when ``sqlite_synchronous`` is ``FULL``, the only mode in which a commit
            costs enough (an ``fsync``) for sharing it to pay (ADR 0025).
        sqlite_synchronous: ``PRAGMA synchronous`` (:data:`SQLITE_SYNCHRONOUS_MODES`).
        **engine_kwargs: passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

    Returns:
        The engine. The caller disposes it (``await engine.dispose()``).

    Raises:
        ValueError: ``sqlite_synchronous`` is not an accepted mode.
    """
    normalized = async_url(url)
    if backend_name(normalized) == "sqlite":
        synchronous = sqlite_synchronous.upper()
        if synchronous not in SQLITE_SYNCHRONOUS_MODES:
            raise ValueError(
                f"sqlite_synchronous must be one of {sorted(SQLITE_SYNCHRONOUS_MODES)}"
            )
        # One thread hop per statement instead of four (store.aiosqlite_one_hop).
        engine_kwargs.setdefault("module", one_hop_dbapi())
        engine = create_async_engine(normalized, echo=echo, **engine_kwargs)
        _install_sqlite_listeners(engine.sync_engine, sqlite_busy_timeout_ms, synchronous)
        _WRITE_GATES[engine.sync_engine] = WriteQueue(
            sqlite_write_queue_seconds,
            sqlite_write_queue_depth,
            group_commit=(synchronous == "FULL")
            if sqlite_group_commit is None
            else sqlite_group_commit,
        )
        return engine
    engine_kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(normalized, echo=echo, **engine_kwargs)
