"""aiosqlite statements in one thread hop each (the SQLite write path, issue "Host performance").

SQLAlchemy's aiosqlite adapter runs every statement as four round trips to aiosqlite's
connection thread: create a cursor, execute, fetch the rows, close the cursor. Each round trip
is a future, a queue put, a ``call_soon_threadsafe`` and a loop turn, and under load the GIL
hand-off between the loop and that thread is the largest single cost of a write transaction
(py-spy on ``SendInput new_turn``: about half of the handler's samples). :class:`OneHopCursor`
does the same work as one function on that thread: a fresh ``sqlite3`` cursor executes, its
rows (when the statement returns any), ``description``, ``rowcount`` and ``lastrowid`` are
kept, and it is closed at once. The results, the errors (the driver's own exception types,
raised on the loop as before) and the order of statements on the connection are unchanged;
only the number of hops is. Server-side cursors (``stream_results``) keep SQLAlchemy's own
cursor.

:func:`one_hop_dbapi` is passed to ``create_async_engine`` as ``module``. It uses aiosqlite's
``Connection._execute`` (run a function on the connection's thread) and ``_conn`` (the
``sqlite3`` connection), which aiosqlite's own methods are built on.
"""

from __future__ import annotations

import collections
import sqlite3
from typing import Any

import aiosqlite
from sqlalchemy.dialects.sqlite.aiosqlite import (
    AsyncAdapt_aiosqlite_connection,
    AsyncAdapt_aiosqlite_cursor,
    AsyncAdapt_aiosqlite_dbapi,
)

__all__ = ["OneHopCursor", "one_hop_dbapi"]

_Outcome = tuple[Any, list[Any] | None, int, int | None]
"""``(description, rows or None, rowcount, lastrowid)`` of one statement."""


def _run(connection: sqlite3.Connection, operation: str, parameters: Any, many: bool) -> _Outcome:
    """Execute on the connection's thread with a fresh cursor, fetch, and close it."""
    cursor = connection.cursor()
    try:
        if many:
            cursor.executemany(operation, parameters)
        elif parameters is None:
            cursor.execute(operation)
        else:
            cursor.execute(operation, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description else None
        # Read after the fetch: a DML statement with RETURNING counts its rows as they come.
        return description, rows, cursor.rowcount, cursor.lastrowid
    finally:
        cursor.close()


class OneHopCursor(AsyncAdapt_aiosqlite_cursor):
    """A buffered cursor whose every ``execute`` is one function on aiosqlite's thread."""

    __slots__ = ("_arraysize", "_description", "_lastrowid", "_rowcount")

    def _make_new_cursor(self, connection: Any) -> Any:
        # No driver cursor lives between statements: each execute opens and closes its own.
        self._description: Any = None
        self._rowcount = -1
        self._lastrowid: int | None = None
        self._arraysize = 1
        return None

    def _aenter_cursor(self, cursor: Any) -> Any:
        return cursor

    @property
    def description(self) -> Any:
        """The last statement's column description (``None`` when it returned no rows)."""
        return self._description

    @property
    def rowcount(self) -> int:
        """The last statement's row count, as ``sqlite3`` reports it."""
        return self._rowcount

    @property
    def lastrowid(self) -> Any:
        """The last statement's ``lastrowid``, as ``sqlite3`` reports it."""
        return self._lastrowid

    @property
    def arraysize(self) -> int:
        """Rows per ``fetchmany`` by default."""
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value

    async def _execute_async(self, operation: Any, parameters: Any) -> Any:
        await self._statement(operation, parameters, many=False)

    async def _executemany_async(self, operation: Any, seq_of_parameters: Any) -> Any:
        await self._statement(operation, seq_of_parameters, many=True)

    async def _statement(self, operation: Any, parameters: Any, *, many: bool) -> None:
        connection: aiosqlite.Connection = self._connection  # type: ignore[assignment]
        async with self._adapt_connection._execute_mutex:
            outcome: _Outcome = await connection._execute(  # type: ignore[no-untyped-call]
                _run, connection._conn, operation, parameters, many
            )
        self._description, rows, self._rowcount, self._lastrowid = outcome
        self._rows = collections.deque(rows or ())

    async def _async_soft_close(self) -> None:
        """Nothing to close: the driver cursor closed with its statement."""

    def close(self) -> None:
        """Drop any unread rows (the driver cursor is already closed)."""
        self._rows.clear()

    def setinputsizes(self, *inputsizes: Any) -> None:
        """A no-op, as in ``sqlite3``."""

    def nextset(self) -> None:
        """``sqlite3`` has no further result sets."""
        raise NotImplementedError("sqlite3 cursors have no nextset()")


class OneHopConnection(AsyncAdapt_aiosqlite_connection):
    """SQLAlchemy's aiosqlite connection adapter with :class:`OneHopCursor` cursors."""

    __slots__ = ()
    _cursor_cls = OneHopCursor


class _OneHopDBAPI(AsyncAdapt_aiosqlite_dbapi):
    def connect(self, *arg: Any, **kw: Any) -> AsyncAdapt_aiosqlite_connection:
        adapted = super().connect(*arg, **kw)
        return OneHopConnection(self, adapted._connection)


def one_hop_dbapi() -> Any:
    """The DB-API module for ``create_async_engine(..., module=...)`` on ``sqlite+aiosqlite``."""
    return _OneHopDBAPI(aiosqlite, sqlite3)
