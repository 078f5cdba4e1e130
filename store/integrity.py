"""A value the store refuses reaches callers as a typed error, never as INTERNAL (SEC-4).

A constraint violation (``IntegrityError``: a check, unique or foreign-key constraint) or a
value the database cannot hold (``DataError``: a NUL character in Postgres ``text``, an
out-of-range number) rolled its transaction back completely, and retrying the same input
fails the same way. :func:`store_refusal` turns one into ``FailedPrecondition`` (reason
:data:`STORE_CONSTRAINT_VIOLATION` or :data:`STORE_VALUE_REJECTED`) naming the constraint
when the driver reports it, with no SQL, parameters or driver text in the message.

Unlike contention (:mod:`store.contention`) this is not applied by the transaction helpers:
some writers catch ``IntegrityError`` on purpose (the purge detects a concurrently changed
tree by it), so each caller that turns input into rows maps it where it knows the input.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Final

from sqlalchemy.exc import DataError, IntegrityError

from domainerrors import FailedPrecondition

__all__ = [
    "STORE_CONSTRAINT_VIOLATION",
    "STORE_VALUE_REJECTED",
    "store_refusal",
    "violated_constraint",
]

STORE_CONSTRAINT_VIOLATION: Final = "STORE_CONSTRAINT_VIOLATION"
"""Reason of a write that broke a store constraint."""

STORE_VALUE_REJECTED: Final = "STORE_VALUE_REJECTED"
"""Reason of a value the database could not store."""

_SQLITE_CONSTRAINT = re.compile(r"constraint failed: ([\w.]+)")


def violated_constraint(error: IntegrityError) -> str | None:
    """The name of the violated constraint (Postgres), or its SQLite description.

    SQLite names check constraints (``ck_sessions_tombstone_has_no_active_turn``) and gives
    ``table.column`` for unique ones; a foreign-key failure carries no name.
    """
    orig = error.orig
    diag = getattr(orig, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(orig, sqlite3.IntegrityError):
        found = _SQLITE_CONSTRAINT.search(str(orig))
        if found is not None:
            return found.group(1)
        if "FOREIGN KEY" in str(orig):
            return "foreign_key"
    return None


def store_refusal(error: BaseException) -> FailedPrecondition | None:
    """The typed error for a constraint violation or a refused value, else ``None``."""
    if isinstance(error, IntegrityError):
        constraint = violated_constraint(error)
        metadata = {"constraint": constraint} if constraint else {}
        return FailedPrecondition(
            "the write would break a store constraint" + (f" ({constraint})" if constraint else ""),
            reason=STORE_CONSTRAINT_VIOLATION,
            metadata=metadata,
        )
    if isinstance(error, DataError):
        return FailedPrecondition(
            "the store cannot hold a value of this request", reason=STORE_VALUE_REJECTED
        )
    return None
