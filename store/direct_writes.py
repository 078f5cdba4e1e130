"""Small write transactions on the database driver itself, each in one hop to a writer thread.

Through SQLAlchemy's asyncio ORM a write transaction costs one event-loop round trip to the
driver per statement (``BEGIN``, each statement, ``COMMIT``) plus the unit of work's flush
machinery; for a transaction of a few point statements that is most of its cost (py-spy on
``SendInput new_turn``, ADR 0034). :class:`DirectWrites` runs a *synchronous* function of a
:class:`WriteConnection` — its statements, its decisions between them and the commit — on a
thread that owns a connection of the backend's own driver (``sqlite3``; psycopg 3's sync
``Connection``), so the event loop pays one hop per transaction. It is the write-side twin of
``store.direct_reads`` (ADR 0023) and shares its compiled statements (:class:`ReadQuery` for
reads, :class:`WriteStatement` for ``INSERT``/``UPDATE``/``DELETE``).

Semantics are those of ``TransactionRunner.run(write=True)``:

- **SQLite**: the transaction waits in this process's write line (``sqlite_write_slot``: the
  same first-come-first-served line every writer of the process waits in) and runs
  ``BEGIN IMMEDIATE … COMMIT`` on one dedicated connection (``foreign_keys=ON``, the engine's
  ``synchronous`` and busy timeout). It takes the writer alone: with group commit on (ADR 0025)
  it does not share another group's commit, which only costs a commit of its own.
- **Postgres**: one of a few connections at ``READ COMMITTED`` (the engine's isolation), each on
  its own thread; row locks (``FOR UPDATE``) wait like the ORM's did.
- A failed function rolls everything back; contention becomes ``Unavailable`` (``STORE_BUSY``)
  or ``Aborted`` (``STORE_CONFLICT``) through ``store.contention``, a lost connection
  ``Unavailable`` (the next transaction reconnects). Nothing is retried: the caller decides.
- A caller cancelled while its transaction runs on the thread waits for it to end (commit or
  rollback) before the cancellation reaches it, so the write line is never released while the
  writer still holds SQLite's lock.

A write function can also run inside an ORM transaction, on that transaction's connection
(:class:`TransactionWriteConnection`, through ``AsyncConnection.run_sync``), so a write that is
part of a larger ORM transaction (the activity append) has one implementation, not two.

A direct write that changes activity appends its own ``activity_events`` rows on the same
connection (``repository.activity_events.append_events``) and its caller publishes them after
the commit: Host's ``HostContext.write_activity`` does both (the submit, ADR 0034).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Delete, Insert, TextClause, Update

from domainerrors import Unavailable
from store.contention import RETRY_AFTER_SECONDS, retryable_error
from store.direct_reads import PG_CONNECT_TIMEOUT_SECONDS, CompiledSql, ReadConnection, ReadQuery
from store.engine import DEFAULT_SQLITE_BUSY_TIMEOUT_MS, backend_name, sqlite_write_slot
from store.write_queue import SqliteWriteSlotTimeout

if TYPE_CHECKING:
    from store.read_unions import ReadUnion

__all__ = [
    "DEFAULT_WRITE_CONNECTIONS",
    "DirectWrites",
    "TransactionWriteConnection",
    "WriteConnection",
    "WriteStatement",
]

DEFAULT_WRITE_CONNECTIONS: Final = 4
"""Postgres connections (one thread each) a process keeps for direct writes; SQLite has one
writer and so one connection."""

CLOSE_TIMEOUT_SECONDS: Final = 5.0
"""How long :meth:`DirectWrites.close` waits for a running transaction per connection."""

ResultT = TypeVar("ResultT")
ReadT = TypeVar("ReadT")

_PLACEHOLDER: Final = re.compile(rb"\$(\d+)")


class WriteStatement:
    """A Core ``insert()``/``update()``/``delete()``, compiled once per backend on first use.

    Like :class:`~store.direct_reads.ReadQuery`: named ``bindparam`` s, fixed arity (a
    statement that would expand an ``IN`` list at execution is refused with ``ValueError``).
    """

    def __init__(self, statement: Insert | Update | Delete | TextClause) -> None:
        self.statement = statement
        self._compiled: dict[str, CompiledSql] = {}

    def compiled(self, backend: str) -> CompiledSql:
        """The statement for ``backend`` (``"sqlite"`` or ``"postgresql"``)."""
        found = self._compiled.get(backend)
        if found is None:
            # Compiling twice in a race yields the same SQL; the last one stays.
            found = self._compiled[backend] = CompiledSql(self.statement, backend)
        return found


class WriteConnection:
    """The statements of one write transaction, on the thread that owns the connection.

    Writes whose outcome the function does not read (no row count, no rows) go through
    :meth:`defer`. On Postgres they are not sent alone: they travel with the next statement
    that says it may carry them (``carries_deferred``), as data-modifying CTEs of that one
    statement, so a transaction's inserts and updates cost one round trip with its last
    statement instead of one each. Any other statement, and the commit, first sends what is
    deferred as one statement of its own, so every read sees every earlier write. SQLite
    runs each write at once: in-process, it has no round trips to save.
    """

    def __init__(self, backend: str, connection: Any) -> None:
        self.backend = backend
        self._connection = connection
        self._deferred: list[tuple[CompiledSql, Any]] = []

    def first(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> Any | None:
        """The first row of ``query`` (a named tuple) or ``None``; ``FOR UPDATE`` locks it."""
        compiled = query.compiled(self.backend)
        row = self._execute(compiled, compiled.bind(params)).fetchone()
        return None if row is None else compiled.decode(row)

    def all(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row of ``query`` (named tuples); ``FOR UPDATE`` locks them."""
        compiled = query.compiled(self.backend)
        rows = self._execute(compiled, compiled.bind(params)).fetchall()
        return [compiled.decode(row) for row in rows]

    def union(self, union: ReadUnion, params: Mapping[str, Any]) -> dict[str, list[Any]]:
        """Each part's rows of ``union`` by part name (``store.read_unions``).

        One statement on Postgres (one snapshot, one round trip); one statement per part on
        SQLite, whose write transaction holds the database and so sees one state anyway.
        """
        if self.backend != "postgresql":
            return {
                name: self.all(query, params)
                for name, query in zip(union.names, union.part_queries, strict=True)
            }
        compiled = union.compiled(self.backend)
        found = self._execute(compiled, compiled.bind(params)).fetchall()
        result: dict[str, list[Any]] = compiled.decode(found)
        return result

    def execute(
        self,
        statement: WriteStatement,
        params: Mapping[str, Any] | None = None,
        *,
        carries_deferred: bool = False,
    ) -> int:
        """Run a write statement; return the number of rows it changed.

        ``carries_deferred``: the statement touches no row a deferred write touches, so
        those may travel with it (see the class).
        """
        compiled = statement.compiled(self.backend)
        cursor = self._execute(compiled, compiled.bind(params), carries_deferred)
        return int(cursor.rowcount)

    def defer(self, statement: WriteStatement, params: Mapping[str, Any] | None = None) -> None:
        """Run a write whose row count the function does not need, at the latest by the commit.

        Deferred writes must touch different rows from each other (on Postgres they run as
        CTEs of one statement, which see one snapshot and no effect of each other).
        """
        compiled = statement.compiled(self.backend)
        if self.backend != "postgresql":
            self._connection.execute(compiled.sql, compiled.bind(params))
            return
        self._deferred.append((compiled, compiled.bind(params)))

    def flush(self) -> None:
        """Send the deferred writes now (the commit does; so does every other statement)."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            sql, values = _with_ctes(deferred, None, [])
            self._connection.execute(sql, values)

    def returned(
        self,
        statement: WriteStatement,
        params: Mapping[str, Any] | None = None,
        *,
        carries_deferred: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run a write statement with ``RETURNING``; its rows as plain tuples.

        ``carries_deferred``: as :meth:`execute`.
        """
        compiled = statement.compiled(self.backend)
        cursor = self._execute(compiled, compiled.bind(params), carries_deferred)
        return [tuple(row) for row in cursor]

    def returned_each(
        self, statement: WriteStatement, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """Run a one-row ``INSERT … RETURNING`` once per parameter row; results in row order.

        One statement per row keeps the arity fixed (compiled once) and the order of the
        returned rows that of ``rows`` on both backends.
        """
        compiled = statement.compiled(self.backend)
        found: list[tuple[Any, ...]] = []
        for params in rows:
            row = self._execute(compiled, compiled.bind(params)).fetchone()
            found.append(tuple(row))
        return found

    def _execute(self, compiled: CompiledSql, values: Any, carries: bool = False) -> Any:
        if not self._deferred:
            return self._connection.execute(compiled.sql, values)
        if not carries:
            self.flush()
            return self._connection.execute(compiled.sql, values)
        deferred, self._deferred = self._deferred, []
        sql, combined = _with_ctes(deferred, compiled, values)
        return self._connection.execute(sql, combined)


_COMBINED_LIMIT: Final = 256
_COMBINED: dict[tuple[str | bytes | None, ...], bytes] = {}
"""Combined statements by their parts' SQL (few shapes: the hot paths' own). A part's SQL is
one long-lived object per compiled statement, so its hash is computed once."""


def _with_ctes(
    deferred: list[tuple[CompiledSql, Any]], carrier: CompiledSql | None, values: Any
) -> tuple[bytes, list[Any]]:
    """One Postgres statement: the deferred writes as CTEs of ``carrier`` (or ``SELECT 1``).

    Each part's ``$n`` parameters are renumbered after the parts before it; the parameter
    list is the parts' lists in the same order.
    """
    parts = [compiled for compiled, _ in deferred]
    key = (*(part.sql for part in parts), None if carrier is None else carrier.sql)
    sql = _COMBINED.get(key)
    if sql is None:
        sql = _combine(parts, carrier)
        if len(_COMBINED) < _COMBINED_LIMIT:
            _COMBINED[key] = sql
    combined: list[Any] = []
    for _, bound in deferred:
        combined.extend(bound)
    combined.extend(values)
    return sql, combined


def _combine(parts: list[CompiledSql], carrier: CompiledSql | None) -> bytes:
    offset = 0
    ctes: list[bytes] = []
    for index, part in enumerate(parts):
        ctes.append(b"deferred_%d AS (%s)" % (index, _renumber(_sql(part), offset)))
        offset += part.arity
    prefix = b"WITH " + b", ".join(ctes)
    if carrier is None:
        return prefix + b" SELECT 1"
    body = _renumber(_sql(carrier), offset)
    if body[:5].upper() == b"WITH ":
        return prefix + b", " + body[5:]
    return prefix + b" " + body


def _sql(compiled: CompiledSql) -> bytes:
    return compiled.sql if isinstance(compiled.sql, bytes) else compiled.sql.encode()


def _renumber(sql: bytes, offset: int) -> bytes:
    if not offset:
        return sql
    return _PLACEHOLDER.sub(lambda match: b"$%d" % (int(match.group(1)) + offset), sql)


class TransactionWriteConnection(WriteConnection):
    """A :class:`WriteConnection` over an open SQLAlchemy transaction's sync ``Connection``.

    So a write function runs inside an ORM transaction too (through
    ``AsyncConnection.run_sync``): the same function, the same Core statements, executed by
    SQLAlchemy on that transaction's connection instead of the driver's raw cursor. One
    implementation of a write then serves both the direct path and a larger ORM transaction
    that includes it.
    """

    def __init__(self, connection: Connection) -> None:
        super().__init__(connection.dialect.name, connection)
        self._sa = connection

    def first(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> Any | None:
        """The first row of ``query`` or ``None``; ``FOR UPDATE`` locks it."""
        return self._sa.execute(query.statement, dict(params or {})).first()

    def all(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row of ``query``; ``FOR UPDATE`` locks them."""
        return list(self._sa.execute(query.statement, dict(params or {})).all())

    def union(self, union: ReadUnion, params: Mapping[str, Any]) -> dict[str, list[Any]]:
        """Each part's rows of ``union``, one statement per part (the ORM path is not hot)."""
        return {
            name: self.all(query, params)
            for name, query in zip(union.names, union.part_queries, strict=True)
        }

    def execute(
        self,
        statement: WriteStatement,
        params: Mapping[str, Any] | None = None,
        *,
        carries_deferred: bool = False,
    ) -> int:
        """Run a write statement; return the number of rows it changed."""
        result = self._sa.execute(statement.statement, dict(params or {}))
        return int(getattr(result, "rowcount", 0) or 0)

    def defer(self, statement: WriteStatement, params: Mapping[str, Any] | None = None) -> None:
        """Run the write at once (SQLAlchemy sends each statement on its own)."""
        self._sa.execute(statement.statement, dict(params or {}))

    def flush(self) -> None:
        """Nothing is ever deferred here."""

    def returned(
        self,
        statement: WriteStatement,
        params: Mapping[str, Any] | None = None,
        *,
        carries_deferred: bool = False,
    ) -> list[tuple[Any, ...]]:
        """Run a write statement with ``RETURNING``; its rows as plain tuples."""
        return [tuple(row) for row in self._sa.execute(statement.statement, dict(params or {}))]

    def returned_each(
        self, statement: WriteStatement, rows: Sequence[Mapping[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """One execution for all rows; results in row order (``sort_by_parameter_order``).

        SQLAlchemy's "insertmanyvalues" sends the rows as one multi-row ``INSERT`` where the
        driver can return the rows in order (Postgres) and one row at a time where it cannot
        (SQLite). ``statement`` must be built with ``returning(…, sort_by_parameter_order=True)``.
        """
        if not rows:
            return []
        if len(rows) == 1:
            return self.returned(statement, rows[0])
        return [tuple(row) for row in self._sa.execute(statement.statement, list(rows))]


class _LostConnection(Exception):
    """Internal: the driver connection broke; carries the refusal to raise."""

    def __init__(self, refusal: Unavailable) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class _Writer:
    """One thread and the driver connection it alone uses (opened on first use)."""

    def __init__(
        self, index: int, backend: str, target: str, busy_timeout_ms: int, synchronous: str
    ) -> None:
        self.backend = backend
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"store-write-{index}")
        self._target = target
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._connection: Any = None

    def _connect(self) -> Any:
        if self.backend == "sqlite":
            connection = sqlite3.connect(self._target, isolation_level=None, check_same_thread=True)
            try:
                # The engine's connection settings (store.engine): every writer alike.
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA foreign_keys=ON")
                connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
                connection.execute(f"PRAGMA synchronous={self._synchronous}")
            except BaseException:
                connection.close()
                raise
            return connection
        target = self._target
        if "connect_timeout" not in conninfo_to_dict(target):
            target = make_conninfo(target, connect_timeout=PG_CONNECT_TIMEOUT_SECONDS)
        # Autocommit, so ``transaction()`` sends exactly BEGIN … COMMIT; $n statements go
        # through the raw cursor as they are (no placeholder parsing per call).
        return psycopg.Connection.connect(target, autocommit=True, cursor_factory=psycopg.RawCursor)

    def run(
        self,
        write: Callable[[WriteConnection], ResultT],
        then: Callable[[ReadConnection], Any] | None = None,
    ) -> Any:
        """Run ``write`` in one transaction on this thread's connection and commit it.

        With ``then``, return ``(result, then's result)``: ``then`` reads after the commit,
        on this connection, what is now committed (one statement in autocommit on Postgres;
        a read transaction on SQLite, still inside the process's write line).
        """
        try:
            if self._connection is None:
                self._connection = self._connect()
            connection = self._connection
            writer = WriteConnection(self.backend, connection)
            if self.backend == "sqlite":
                connection.execute("BEGIN IMMEDIATE")
                try:
                    result = write(writer)
                    connection.execute("COMMIT")
                finally:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
            else:
                with connection.transaction():
                    result = write(writer)
                    writer.flush()
            if then is None:
                return result
        except (sqlite3.Error, psycopg.Error) as exc:
            mapped = retryable_error(DBAPIError(None, None, exc))
            if mapped is not None:
                raise mapped from exc
            if isinstance(exc, psycopg.OperationalError) or (
                isinstance(exc, sqlite3.OperationalError) and self._broken(exc)
            ):
                self.close()
                refusal = Unavailable(
                    f"the store did not answer a write ({exc}); retry the call",
                    reason="STORE_BUSY",
                    retry_after_seconds=RETRY_AFTER_SECONDS,
                )
                raise _LostConnection(refusal) from exc
            raise
        try:
            return result, self._read(then)
        except (sqlite3.Error, psycopg.Error) as exc:
            # The write has committed; its caller reads again on the read path.
            if isinstance(exc, psycopg.OperationalError) or (
                isinstance(exc, sqlite3.OperationalError) and self._broken(exc)
            ):
                self.close()
            return result, None

    def _read(self, read: Callable[[ReadConnection], ReadT]) -> ReadT:
        connection = self._connection
        if self.backend == "postgresql":
            return read(ReadConnection(self.backend, connection, one_statement=True))
        connection.execute("BEGIN")
        try:
            return read(ReadConnection(self.backend, connection, unions_as_one_statement=False))
        finally:
            if connection.in_transaction:
                connection.execute("COMMIT")

    @staticmethod
    def _broken(exc: sqlite3.OperationalError) -> bool:
        # SQLITE_IOERR, SQLITE_CANTOPEN: the file is there but not now.
        return getattr(exc, "sqlite_errorcode", 0) & 0xFF in (10, 14)

    def close(self) -> None:
        """Close the connection (on this writer's thread)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sqlite3.Error, psycopg.Error):
                connection.close()


class DirectWrites:
    """Driver connections on their own threads for small write transactions.

    Args:
        url: the store's database URL (any form ``store.engine`` accepts).
        engine: the store's async engine; on SQLite its write line orders these writes with
            every other writer of the process.
        connections: Postgres connections (and threads); SQLite always uses one.
        sqlite_busy_timeout_ms: SQLite lock wait (another process holding the write lock).
        sqlite_synchronous: ``PRAGMA synchronous`` of the SQLite writer (the engine's).
    """

    def __init__(
        self,
        url: str,
        engine: AsyncEngine,
        *,
        connections: int = DEFAULT_WRITE_CONNECTIONS,
        sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
        sqlite_synchronous: str = "NORMAL",
    ) -> None:
        if connections < 1:
            raise ValueError("direct writes need at least one connection")
        self.backend = backend_name(url)
        self._engine = engine
        parsed = make_url(url)
        if self.backend == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                raise ValueError("direct writes need a SQLite file, not an in-memory database")
            target = parsed.database
            connections = 1
        else:
            target = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        self._writers = [
            _Writer(index, self.backend, target, sqlite_busy_timeout_ms, sqlite_synchronous)
            for index in range(connections)
        ]
        self._idle: asyncio.Queue[_Writer] | None = None

    def _pool(self) -> asyncio.Queue[_Writer]:
        if self._idle is None:
            self._idle = asyncio.Queue()
            for writer in self._writers:
                self._idle.put_nowait(writer)
        return self._idle

    async def run(self, write: Callable[[WriteConnection], ResultT]) -> ResultT:
        """Run ``write`` (synchronous) in one committed write transaction, one thread hop.

        Raises: as :meth:`run_then_read`.
        """
        result: ResultT = await self._run(write, None)
        return result

    async def run_then_read(
        self,
        write: Callable[[WriteConnection], ResultT],
        read: Callable[[ReadConnection], ReadT],
    ) -> tuple[ResultT, ReadT | None]:
        """:meth:`run`, then ``read`` what is committed, in the same thread hop.

        The read runs on the writer's connection after the commit (so it reads the write's
        rows back as any later reader would), as one statement on Postgres. When the store
        fails the read (not the write), the read's result is ``None``: the write has
        committed, and the caller reads again on the read path.

        Raises:
            domainerrors.Unavailable: ``STORE_BUSY`` (the write line or the store did not
                admit the transaction in time, or the connection was lost); nothing committed
                unless the loss came during the commit.
            domainerrors.Aborted: ``STORE_CONFLICT``; nothing committed.
            Exception: whatever ``write`` raised; nothing committed.
        """
        found: tuple[ResultT, ReadT | None] = await self._run(write, read)
        return found

    async def _run(
        self,
        write: Callable[[WriteConnection], Any],
        read: Callable[[ReadConnection], Any] | None,
    ) -> Any:
        pool = self._pool()
        writer = await pool.get()
        try:
            async with sqlite_write_slot(self._engine):
                done = asyncio.get_running_loop().run_in_executor(
                    writer.executor, writer.run, write, read
                )
                return await _to_its_end(done)
        except _LostConnection as lost:
            raise lost.refusal from lost.__cause__
        except SqliteWriteSlotTimeout as exc:
            # The write line did not admit it: the same refusal TransactionRunner gives.
            refusal = retryable_error(exc)
            if refusal is None:
                raise
            raise refusal from exc
        finally:
            pool.put_nowait(writer)

    async def close(self) -> None:
        """Wait (boundedly) for running transactions, then close every connection."""
        loop = asyncio.get_running_loop()
        for writer in self._writers:
            closing = loop.run_in_executor(writer.executor, writer.close)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing, CLOSE_TIMEOUT_SECONDS)
            writer.executor.shutdown(wait=False)


async def _to_its_end(done: asyncio.Future[ResultT]) -> ResultT:
    """Await a transaction on its thread; a cancellation waits for it to end first."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(done)
            break
        except asyncio.CancelledError:
            if done.done():
                raise
            cancelled = True  # the thread still holds the transaction: let it finish
        except BaseException:
            if cancelled:
                raise asyncio.CancelledError from None
            raise
    if cancelled:
        raise asyncio.CancelledError
    return result
