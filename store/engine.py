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

from typing import Any, Final

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

__all__ = [
    "DEFAULT_SQLITE_BUSY_TIMEOUT_MS",
    "SQLITE_BEGIN_OPTION",
    "async_url",
    "backend_name",
    "create_async_engine_for",
    "create_sync_engine_for",
    "sync_url",
]

DEFAULT_SQLITE_BUSY_TIMEOUT_MS: Final = 5_000
"""How long a SQLite connection waits for a lock before failing with ``database is locked``."""

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
    **engine_kwargs: Any,
) -> AsyncEngine:
    """Create a configured asyncio engine (used by the services).

    Args:
        url: any accepted database URL; its driver is normalized with :func:`async_url`.
        echo: log SQL statements.
        sqlite_busy_timeout_ms: SQLite lock wait before ``database is locked``.
        **engine_kwargs: passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

    Returns:
        The engine. The caller disposes it (``await engine.dispose()``).
    """
    normalized = async_url(url)
    if backend_name(normalized) == "sqlite":
        engine = create_async_engine(normalized, echo=echo, **engine_kwargs)
        _install_sqlite_listeners(engine.sync_engine, sqlite_busy_timeout_ms)
        return engine
    engine_kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(normalized, echo=echo, **engine_kwargs)
