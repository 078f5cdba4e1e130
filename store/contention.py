"""Lock contention in the store reaches callers as a typed, retryable error (CON-5).

An overloaded store is not a bug: a SQLite writer that waited past the busy timeout
(``database is locked``) or in this process's write queue, a connection pool that stayed
exhausted, a Postgres transaction aborted as a serialization failure or a
deadlock victim, or a lock wait that ran out, all rolled back completely, so the caller may
retry the whole call. :func:`retryable_error` turns such a driver error into
``Unavailable`` (reason ``STORE_BUSY``: the store did not admit the transaction in time) or
``Aborted`` (reason ``STORE_CONFLICT``: the database aborted it to resolve a conflict), both
with ``RetryInfo``. The ``store.transactions`` helpers apply it to every transaction they run,
so repositories and domain code never look at driver errors.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from domainerrors import Aborted, DomainError, Unavailable
from store.write_queue import GroupRolledBack, SqliteWriteSlotTimeout

__all__ = ["RETRY_AFTER_SECONDS", "retryable_error"]

RETRY_AFTER_SECONDS: Final = 1.0
"""The ``RetryInfo`` delay of a contention error."""

_SQLITE_BUSY_CODES: Final = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_SQLITE_BUSY_MESSAGES: Final = (
    "database is locked",
    "database is busy",
    "database table is locked",
)
_PG_CONFLICT_STATES: Final = frozenset({"40001", "40P01"})  # serialization_failure, deadlock
_PG_BUSY_STATES: Final = frozenset({"55P03"})  # lock_not_available (lock_timeout)


def retryable_error(exc: BaseException) -> DomainError | None:
    """The typed error for a contention failure, or ``None`` for anything else.

    Args:
        exc: what a transaction raised (a SQLAlchemy ``DBAPIError`` wraps driver errors).
    """
    if isinstance(exc, SqliteWriteSlotTimeout):
        return _busy(str(exc))
    if isinstance(exc, GroupRolledBack):
        # Another member of the shared commit left it unusable; this one did nothing wrong.
        return _conflict(str(exc), {})
    if isinstance(exc, PoolTimeout):
        # Every pooled connection stayed busy for the pool timeout: the store is saturated.
        return _busy("no database connection came free in time")
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    if isinstance(orig, sqlite3.OperationalError):
        code = getattr(orig, "sqlite_errorcode", None)
        busy = (code is not None and code & 0xFF in _SQLITE_BUSY_CODES) or any(
            text in str(orig).lower() for text in _SQLITE_BUSY_MESSAGES
        )
        return _busy(str(orig)) if busy else None
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_CONFLICT_STATES:
        return _conflict("", {"sqlstate": str(sqlstate)})
    if sqlstate in _PG_BUSY_STATES:
        return _busy(f"lock not available (sqlstate {sqlstate})")
    return None


def _conflict(detail: str, metadata: dict[str, str]) -> Aborted:
    return Aborted(
        "the store aborted the transaction to resolve a conflict; retry the call"
        + (f" ({detail})" if detail else ""),
        reason="STORE_CONFLICT",
        metadata=metadata,
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )


def _busy(detail: str) -> Unavailable:
    return Unavailable(
        f"the store is busy ({detail}); retry the call",
        reason="STORE_BUSY",
        retry_after_seconds=RETRY_AFTER_SECONDS,
    )
