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

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

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


class SqliteWriteSlotTimeout(TimeoutError):
    """This process's write queue did not admit the transaction (waited too long, or full)."""


class _WriteGate:
    """The queue of one SQLite engine's write transactions in this process.

    SQLite admits one writer at a time. Without a queue, concurrent ``BEGIN IMMEDIATE`` calls
    wait in SQLite's busy handler, which sleeps and polls: latency grows with the number of
    writers and a writer can starve past the busy timeout. Writers of this process therefore
    queue on an ``asyncio.Lock`` (first come, first served) and only the head of the queue
    talks to SQLite; other processes on the same file still meet the busy timeout.
    """

    def __init__(self, timeout_seconds: float, max_waiting: int) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_waiting = max_waiting
        self.waiting = 0
        # One lock per event loop: an asyncio.Lock belongs to the loop that first waits on it.
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock


_WRITE_GATES: weakref.WeakKeyDictionary[Engine, _WriteGate] = weakref.WeakKeyDictionary()


@asynccontextmanager
async def sqlite_write_slot(engine: AsyncEngine) -> AsyncIterator[None]:
    """Hold this process's write slot of a SQLite ``engine`` (a no-op on Postgres).

    Every write transaction of an async SQLite engine begins inside this context (the
    ``store.transactions`` helpers do it), so this process's writers queue in order instead of
    polling SQLite's lock. Holding it while already holding it on the same engine would wait
    for itself: never nest write transactions.

    Raises:
        SqliteWriteSlotTimeout: the slot did not come free within the queue timeout, or the
            queue already holds its maximum of waiting writers.
    """
    gate = _WRITE_GATES.get(engine.sync_engine)
    if gate is None:
        yield
        return
    lock = gate.lock()
    if lock.locked() and gate.waiting >= gate.max_waiting:
        raise SqliteWriteSlotTimeout(
            f"the SQLite write queue is full ({gate.waiting} writers waiting)"
        )
    gate.waiting += 1
    try:
        async with asyncio.timeout(gate.timeout_seconds):
            await lock.acquire()
    except TimeoutError as exc:
        raise SqliteWriteSlotTimeout(
            f"no SQLite write slot within {gate.timeout_seconds:g} s"
        ) from exc
    finally:
        gate.waiting -= 1
    try:
        yield
    finally:
        lock.release()


def _install_sqlite_listeners(engine: Engine, busy_timeout_ms: int) -> None:
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
            # newest commits (the state before them), never tear one (STORE-3).
            cursor.execute("PRAGMA synchronous=NORMAL")
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
        **engine_kwargs: passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

    Returns:
        The engine. The caller disposes it (``await engine.dispose()``).
    """
    normalized = async_url(url)
    if backend_name(normalized) == "sqlite":
        engine = create_async_engine(normalized, echo=echo, **engine_kwargs)
        _install_sqlite_listeners(engine.sync_engine, sqlite_busy_timeout_ms)
        _WRITE_GATES[engine.sync_engine] = _WriteGate(
            sqlite_write_queue_seconds, sqlite_write_queue_depth
        )
        return engine
    engine_kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(normalized, echo=echo, **engine_kwargs)
