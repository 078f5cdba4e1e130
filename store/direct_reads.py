"""Hot read transactions on the database driver itself, each in one hop to a dedicated thread.

Host's hot reads (``GetSession``, a transcript page, a submission's read-back) are a handful
of point and range statements. Run through SQLAlchemy's asyncio layer they cost one event-loop
round trip per statement to the driver's thread plus the ORM's unit-of-work machinery; on this
machine that is ~7 ms of CPU for ``GetSession``'s five statements, against ~0.35 ms for the
same transaction on ``sqlite3`` in one thread hop (``bench/storage_stack_bench.py``, ADR 0023).

:class:`DirectReads` keeps a few connections of the backend's own driver (``sqlite3``;
psycopg 3's sync ``Connection``, which prepares repeated statements server-side), each owned
by one thread. A read is a *synchronous* function of a :class:`ReadConnection`; the whole
function, its statements and the row decoding run on that thread in one transaction, so the
event loop pays one hop per read, not per statement.

Statements are SQLAlchemy Core ``select()`` constructs (the schema stays ``store.models``),
compiled once per dialect by :class:`ReadQuery` into the driver's SQL; rows come back as
named tuples whose attributes are the column keys, so the record builders that read ORM rows
read them too. Every read sees one committed state: SQLite's deferred transaction holds one
WAL snapshot; Postgres runs ``REPEATABLE READ READ ONLY``. A read of exactly one statement
(``one_statement``; the parts of a read joined by ``store.read_unions``) skips the
transaction: in autocommit a statement is its own snapshot, and on Postgres that saves the
``BEGIN`` and ``COMMIT`` round trips (ADR 0033).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import namedtuple
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import Boolean
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.sql import Executable, Select

from domainerrors import Unavailable
from store.contention import RETRY_AFTER_SECONDS
from store.engine import DEFAULT_SQLITE_BUSY_TIMEOUT_MS, backend_name

if TYPE_CHECKING:
    from store.read_unions import ReadUnion

__all__ = [
    "DEFAULT_READ_CONNECTIONS",
    "CompiledSql",
    "DirectReads",
    "ReadConnection",
    "ReadQuery",
]

DEFAULT_READ_CONNECTIONS: Final = 4
"""Driver connections (one thread each) a process keeps for hot reads."""
PG_CONNECT_TIMEOUT_SECONDS: Final = 5
"""How long opening a Postgres read connection may take (unless the URL sets its own)."""
CLOSE_TIMEOUT_SECONDS: Final = 5.0
"""How long :meth:`DirectReads.close` waits for a running read per connection."""

ResultT = TypeVar("ResultT")

# SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_CANTOPEN: the file is there but not now.
_SQLITE_UNAVAILABLE_CODES: Final = frozenset({5, 6, 10, 14})

_DIALECTS: Final[dict[str, Dialect]] = {
    "sqlite": pysqlite.dialect(paramstyle="named"),
    # Server-side $n parameters: psycopg's raw cursor sends the SQL as it is. Its default
    # cursor parses every %(name)s statement per call, cached only below 4 KiB of SQL.
    "postgresql": pg_psycopg.dialect(paramstyle="numeric_dollar"),  # type: ignore[no-untyped-call]
}


class CompiledSql:
    """A statement as one driver's SQL, with the parameters it binds at every execution.

    SQLite gets ``:name`` parameters and a mapping; Postgres ``$n`` parameters, the SQL as
    bytes, and a sequence in the compiled order (for psycopg's ``RawCursor``).

    Raises:
        ValueError: the statement would expand parameters (``IN`` lists) at execution.
    """

    __slots__ = ("_fixed", "_order", "sql")

    def __init__(self, statement: Executable, backend: str) -> None:
        compiled = statement.compile(dialect=_DIALECTS[backend])  # type: ignore[attr-defined]
        if compiled.post_compile_params or compiled.literal_execute_params:
            raise ValueError("a direct read cannot expand parameters (IN lists) at execution")
        self._fixed: dict[str, Any] = dict(compiled.params)
        self._order: tuple[str, ...] | None = None
        self.sql: str | bytes = compiled.string
        if backend == "postgresql":
            self._order = tuple(compiled.positiontup or ())
            self.sql = compiled.string.encode()

    @property
    def arity(self) -> int:
        """How many ``$n`` parameters the Postgres SQL has (0 for SQLite's named ones)."""
        return len(self._order or ())

    def bind(self, params: Mapping[str, Any] | None) -> Any:
        """The driver's parameters: the fixed ones, overridden by ``params``."""
        values = {**self._fixed, **params} if params else self._fixed
        if self._order is None:
            return values
        return [values[name] for name in self._order]


class _Compiled(CompiledSql):
    """One ``select()`` compiled for one dialect, with its row decoder."""

    __slots__ = ("decode",)

    def __init__(self, statement: Select[Any], backend: str) -> None:
        super().__init__(statement, backend)
        columns = list(statement.selected_columns)
        row_type = namedtuple("Row", [column.key for column in columns])  # type: ignore[misc]
        make: Callable[[Any], Any] = row_type._make
        booleans = [i for i, c in enumerate(columns) if isinstance(c.type, Boolean)]
        if backend == "sqlite" and booleans:
            # sqlite3 returns the stored 0/1; the schema's Boolean columns read as bool.
            def decode(values: Any) -> Any:
                fields = list(values)
                for index in booleans:
                    if fields[index] is not None:
                        fields[index] = bool(fields[index])
                return make(fields)

            self.decode: Callable[[Any], Any] = decode
        else:
            self.decode = make


class ReadQuery:
    """A Core ``select()`` for direct reads, compiled once per backend on first use.

    Parameters are named ``bindparam`` s; literal values in the statement (a status, a
    ``LIMIT``) are bound once at compile time. Statements that expand an ``IN`` list at
    execution are refused (``ValueError``): give the hot path fixed-arity statements.
    """

    def __init__(self, statement: Select[Any]) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}
        self._lock = threading.Lock()

    def compiled(self, backend: str) -> _Compiled:
        """The statement for ``backend`` (``"sqlite"`` or ``"postgresql"``)."""
        found = self._compiled.get(backend)
        if found is None:
            with self._lock:
                found = self._compiled.get(backend)
                if found is None:
                    found = self._compiled[backend] = _Compiled(self.statement, backend)
        return found


class ReadConnection:
    """The statements of one read, on the thread that owns the connection.

    Args:
        backend: ``"sqlite"`` or ``"postgresql"``.
        connection: the driver connection, in a read transaction unless ``one_statement``.
        one_statement: the read is in autocommit: its one statement is its own snapshot, and
            a second statement is refused (``RuntimeError``), since it would see another
            state.
        unions_as_one_statement: :meth:`union` sends a :class:`~store.read_unions.ReadUnion`
            as its one ``UNION ALL`` statement; otherwise as one statement per part.
    """

    def __init__(
        self,
        backend: str,
        connection: Any,
        *,
        one_statement: bool = False,
        unions_as_one_statement: bool = True,
    ) -> None:
        self._backend = backend
        self._connection = connection
        self._one_statement = one_statement
        self._unions_as_one_statement = unions_as_one_statement
        self._executed = 0

    def _execute(self, sql: str | bytes, values: Any) -> Any:
        if self._one_statement and self._executed:
            raise RuntimeError("a one-statement read ran a second statement (another snapshot)")
        self._executed += 1
        return self._connection.execute(sql, values)

    def all(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row of ``query``, as named tuples."""
        compiled = query.compiled(self._backend)
        rows = self._execute(compiled.sql, compiled.bind(params)).fetchall()
        decode = compiled.decode
        return [decode(row) for row in rows]

    def batch(self, *calls: tuple[ReadQuery, Mapping[str, Any]]) -> list[list[Any]]:
        """The rows of several independent statements, in order.

        A statement that needs another's result expresses that in SQL (a scalar subquery),
        so the batch could travel in one round trip; they run one after another (psycopg's
        pipeline mode cost more CPU than it saved on a local server, ADR 0023). A
        :class:`store.read_unions.ReadUnion` sends such a set as one statement (ADR 0033).
        """
        sent = []
        for query, params in calls:
            compiled = query.compiled(self._backend)
            cursor = self._execute(compiled.sql, compiled.bind(params))
            sent.append((compiled.decode, cursor))
        return [[decode(row) for row in cursor.fetchall()] for decode, cursor in sent]

    def first(self, query: ReadQuery, params: Mapping[str, Any] | None = None) -> Any | None:
        """The first row of ``query`` or ``None``."""
        compiled = query.compiled(self._backend)
        row = self._execute(compiled.sql, compiled.bind(params)).fetchone()
        return None if row is None else compiled.decode(row)

    def union(self, union: ReadUnion, params: Mapping[str, Any]) -> dict[str, list[Any]]:
        """Each part's rows of ``union``, as named tuples by part name, in the part's order.

        One ``UNION ALL`` statement, or (where that costs more than it saves: SQLite, which
        has no round trips to save, ADR 0033) one statement per part in this read's
        transaction; the rows are the same either way.
        """
        if not self._unions_as_one_statement:
            rows = self.batch(*((query, params) for query in union.part_queries))
            return dict(zip(union.names, rows, strict=True))
        compiled = union.compiled(self._backend)
        found = self._execute(compiled.sql, compiled.bind(params)).fetchall()
        result: dict[str, list[Any]] = compiled.decode(found)
        return result


def _unavailable(detail: str) -> Unavailable:
    return Unavailable(
        f"{detail}; retry the call", reason="STORE_BUSY", retry_after_seconds=RETRY_AFTER_SECONDS
    )


class _StoreUnavailable(Exception):
    """Internal: one attempt found the store unavailable (carries the refusal to raise)."""

    def __init__(self, refusal: Unavailable) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class _Worker:
    """One thread and the driver connection it alone uses (opened on first use)."""

    def __init__(
        self,
        index: int,
        backend: str,
        target: str,
        busy_timeout_ms: int,
        unions_as_one_statement: bool,
    ) -> None:
        self.backend = backend
        self.unions_as_one_statement = unions_as_one_statement
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"store-read-{index}")
        self._target = target
        self._busy_timeout_ms = busy_timeout_ms
        self._connection: Any = None

    def _connect(self) -> Any:
        if self.backend == "sqlite":
            connection = sqlite3.connect(self._target, isolation_level=None, check_same_thread=True)
            try:
                connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
                connection.execute("PRAGMA query_only=ON")  # this connection never writes
            except BaseException:
                connection.close()
                raise
            return connection
        target = self._target
        if "connect_timeout" not in conninfo_to_dict(target):
            target = make_conninfo(target, connect_timeout=PG_CONNECT_TIMEOUT_SECONDS)
        # Autocommit: a one-statement read is its own transaction (no BEGIN/COMMIT round
        # trips); a read of several statements opens REPEATABLE READ READ ONLY explicitly.
        pg = psycopg.Connection.connect(target, autocommit=True, cursor_factory=psycopg.RawCursor)
        try:
            pg.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            pg.read_only = True
            # Autocommit statements ignore read_only; this connection never writes either way.
            pg.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        except BaseException:
            pg.close()
            raise
        return pg

    def run(self, read: Callable[[ReadConnection], ResultT], one_statement: bool) -> ResultT:
        """Run ``read`` in one transaction on this thread's connection.

        With ``one_statement`` (and unions sent as one statement) the read's single
        statement runs in autocommit, its own transaction and snapshot, with no ``BEGIN`` or
        ``COMMIT`` to send.

        A Postgres connection that sat idle since its last read may have been closed by the
        server (a restart, an idle timeout): when it turns out broken, the read runs once more
        on a new connection (a read has no effects to repeat).

        Raises:
            domainerrors.Unavailable: ``STORE_BUSY``, the store did not answer.
        """
        reused = self._connection is not None
        try:
            return self._attempt(read, one_statement)
        except _StoreUnavailable as lost:
            if not (reused and self.backend == "postgresql"):
                raise lost.refusal from lost.__cause__
        try:
            return self._attempt(read, one_statement)
        except _StoreUnavailable as again:
            raise again.refusal from again.__cause__

    def _attempt(self, read: Callable[[ReadConnection], ResultT], one_statement: bool) -> ResultT:
        try:
            if self._connection is None:
                self._connection = self._connect()
            connection = self._connection
            if one_statement and self.unions_as_one_statement:
                # sqlite3 without isolation level and psycopg in autocommit: the statement
                # is its own transaction, one snapshot for all its rows.
                return read(ReadConnection(self.backend, connection, one_statement=True))
            reader = ReadConnection(
                self.backend, connection, unions_as_one_statement=self.unions_as_one_statement
            )
            if self.backend == "sqlite":
                connection.execute("BEGIN")
                try:
                    return read(reader)
                finally:
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
            with connection.transaction():
                return read(reader)
        except (sqlite3.OperationalError, psycopg.OperationalError) as exc:
            if isinstance(exc, sqlite3.OperationalError) and (
                getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _SQLITE_UNAVAILABLE_CODES
            ):
                raise  # a statement the store refused is a bug, not a busy store
            # A lost server or a locked file: drop the connection, the next read reconnects.
            self.close()
            refusal = _unavailable(f"the store did not answer a read ({exc})")
            raise _StoreUnavailable(refusal) from exc

    def close(self) -> None:
        """Close the connection (on this worker's thread)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sqlite3.Error, psycopg.Error):
                connection.close()


class DirectReads:
    """A small set of driver connections, each on its own thread, for hot reads.

    Args:
        url: the store's database URL (any form ``store.engine`` accepts).
        connections: how many connections (and threads); reads beyond that queue in order.
        sqlite_busy_timeout_ms: SQLite lock wait (a WAL reader waits only in rare checkpoints).
        unions_as_one_statement: whether a :class:`~store.read_unions.ReadUnion` runs as one
            statement (in autocommit, when the read is ``one_statement``) or as one statement
            per part in a read transaction. Default: one statement on Postgres, where it saves
            round trips; per part on SQLite, where the parts cost less CPU (ADR 0033).
    """

    def __init__(
        self,
        url: str,
        *,
        connections: int = DEFAULT_READ_CONNECTIONS,
        sqlite_busy_timeout_ms: int = DEFAULT_SQLITE_BUSY_TIMEOUT_MS,
        unions_as_one_statement: bool | None = None,
    ) -> None:
        if connections < 1:
            raise ValueError("direct reads need at least one connection")
        self.backend = backend_name(url)
        parsed = make_url(url)
        if self.backend == "sqlite":
            if not parsed.database or parsed.database == ":memory:":
                raise ValueError("direct reads need a SQLite file, not an in-memory database")
            target = parsed.database
        else:
            target = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        if unions_as_one_statement is None:
            unions_as_one_statement = self.backend == "postgresql"
        self._workers = [
            _Worker(index, self.backend, target, sqlite_busy_timeout_ms, unions_as_one_statement)
            for index in range(connections)
        ]
        self._free: asyncio.Queue[_Worker] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has begun; reads are refused from then on."""
        return self._closed

    async def run(
        self, read: Callable[[ReadConnection], ResultT], *, one_statement: bool = False
    ) -> ResultT:
        """Run the synchronous ``read`` in one read transaction on a free connection's thread.

        With ``one_statement`` the read issues exactly one statement or one
        :class:`~store.read_unions.ReadUnion`. Where unions run as one statement (Postgres by
        default) it runs in autocommit: one round trip instead of ``BEGIN``, the statements
        and ``COMMIT`` (ADR 0033), and a second statement is refused with ``RuntimeError``.
        Elsewhere it runs in a read transaction like any read.

        A caller cancelled while its read runs leaves the read to finish on its thread; its
        connection is free again only when the read has ended.

        Raises:
            domainerrors.Unavailable: ``STORE_BUSY`` when the store did not answer, or the
                reads are closing (a call racing the process's shutdown).
            Exception: whatever ``read`` raised (the transaction has ended).
        """
        if self._closed:
            raise _unavailable("the store is closing")
        loop = asyncio.get_running_loop()
        if self._free is None:
            self._free = asyncio.Queue()
            for worker in self._workers:
                self._free.put_nowait(worker)
        free = self._free
        worker = await free.get()
        if self.closed:  # closed while this read waited for a connection
            free.put_nowait(worker)
            raise _unavailable("the store is closing")

        def release(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(free.put_nowait, worker)

        try:
            done = worker.executor.submit(worker.run, read, one_statement)
        except BaseException:
            free.put_nowait(worker)
            raise
        done.add_done_callback(release)
        return await asyncio.wrap_future(done)

    async def close(self, timeout_seconds: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Let running reads finish, then close every connection on its own thread.

        A read still running after ``timeout_seconds`` is left to its thread (daemon-like:
        the executor is shut down without waiting).
        """
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            closing = asyncio.wrap_future(worker.executor.submit(worker.close))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing, timeout_seconds)
            worker.executor.shutdown(wait=False)
