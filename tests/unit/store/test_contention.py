"""Which driver errors ``store.contention`` turns into retryable domain errors (CON-5)."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError

from domainerrors import Aborted, Unavailable
from store.contention import retryable_error
from store.engine import SqliteWriteSlotTimeout


def _wrapped(error: Exception, base: type[Exception]) -> DBAPIError:
    """The SQLAlchemy wrapper a driver error reaches the store as."""
    wrapped = DBAPIError.instance("UPDATE t SET x = 1", {}, error, base)
    assert isinstance(wrapped, DBAPIError)
    return wrapped


@pytest.mark.spec("CON-5")
@pytest.mark.parametrize(
    "message", ["database is locked", "database is busy", "database table is locked: t"]
)
def test_a_busy_sqlite_is_unavailable_with_retry_info(message: str) -> None:
    mapped = retryable_error(_wrapped(sqlite3.OperationalError(message), sqlite3.Error))
    assert isinstance(mapped, Unavailable)
    assert mapped.reason == "STORE_BUSY"
    assert mapped.retry_after_seconds is not None
    assert mapped.retry_after_seconds > 0


@pytest.mark.spec("CON-5")
def test_a_full_write_queue_is_unavailable() -> None:
    mapped = retryable_error(SqliteWriteSlotTimeout("no SQLite write slot within 5 s"))
    assert isinstance(mapped, Unavailable)
    assert mapped.reason == "STORE_BUSY"


@pytest.mark.spec("CON-5")
@pytest.mark.parametrize(
    "error", [psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected]
)
def test_a_postgres_conflict_abort_is_aborted_with_retry_info(error: type[Exception]) -> None:
    mapped = retryable_error(_wrapped(error("conflict"), psycopg.Error))
    assert isinstance(mapped, Aborted)
    assert mapped.reason == "STORE_CONFLICT"
    assert mapped.retry_after_seconds is not None
    assert mapped.retry_after_seconds > 0


@pytest.mark.spec("CON-5")
def test_a_postgres_lock_timeout_is_unavailable() -> None:
    mapped = retryable_error(_wrapped(psycopg.errors.LockNotAvailable("x"), psycopg.Error))
    assert isinstance(mapped, Unavailable)
    assert mapped.reason == "STORE_BUSY"


@pytest.mark.spec("CON-5")
@pytest.mark.parametrize(
    "error",
    [
        _wrapped(sqlite3.OperationalError("no such table: t"), sqlite3.Error),
        _wrapped(sqlite3.IntegrityError("UNIQUE constraint failed"), sqlite3.Error),
        _wrapped(psycopg.errors.UniqueViolation("duplicate"), psycopg.Error),
        ValueError("not a store error"),
    ],
)
def test_other_failures_stay_unmapped(error: Exception) -> None:
    assert retryable_error(error) is None
