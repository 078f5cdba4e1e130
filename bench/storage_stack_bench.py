"""The storage stack under Host's reads: today's path beside the alternatives, side by side.

Run: ``.venv/bin/python -m bench.storage_stack_bench [--backends sqlite,postgres]
[--calls N] [--rounds R]``

Each stack runs the read set of ``GetSession`` — the Session by key, its active Turn by key,
its latest effective Turn, its actionable pending Interactions and its live tree, five
statements in one read transaction — ``--calls`` times at concurrency 32 from one event loop,
**each stack in its own process** (this module started with ``--worker``), on the same
migrated database (a temporary SQLite file; a scratch Postgres database, dropped after). The
stacks run interleaved for ``--rounds`` rounds; the medians are reported with each stack's
throughput ratio to Host's own path and its CPU time per transaction.

Stacks:

* ``host`` — Host's own read as it is in this checkout:
  ``services.host.sessions.commands.get_session`` (since ADR 0023 the direct reads of
  ``store.direct_reads``; before it the ORM ``AsyncSession`` through ``HostContext.transact``);
* ``core`` — SQLAlchemy Core statements built once, on an ``AsyncConnection`` (no ORM
  session, no identity map), rows read by attribute;
* ``core-thread`` — the same Core statements on a *sync* engine, the whole transaction in one
  hop to a thread (four pooled connections);
* ``sqlite3-thread`` (SQLite) — the standard library driver, the whole transaction in one
  hop to a dedicated thread per connection (four connections), instead of one hop per
  statement as aiosqlite makes;
* ``psycopg`` (Postgres) — psycopg 3's ``AsyncConnection`` used directly, four connections,
  server-side prepared statements (``prepare=True``);
* ``psycopg-thread`` (Postgres) — psycopg 3's sync ``Connection``, prepared statements, the
  transaction in one hop to a dedicated thread per connection (four connections);
* ``psycopg-union`` (Postgres) — the same sync connection on a thread, the five statements as
  one ``UNION ALL`` statement (``store.read_unions``) in autocommit: one round trip, no
  ``BEGIN``/``COMMIT`` (ADR 0033), rows split by part but not built into records.

The JSON (``bench/results/storage_stack_bench.json``) records the command line and every
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import psycopg
from sqlalchemy import Table, bindparam, create_engine, insert, select, update

from bench.host_bench import cpu_seconds, database
from bench.stats import write_results
from store.engine import create_async_engine_for
from store.models import Interaction, Session, Turn
from store.read_unions import ReadUnion, UnionPart

WORKSPACE = "ws-bench"
SESSION = "s-bench"
CONCURRENCY = 32
CONNECTIONS = 4
STACKS = {
    "sqlite": ("host", "core", "core-thread", "sqlite3-thread"),
    "postgres": ("host", "core", "core-thread", "psycopg", "psycopg-thread", "psycopg-union"),
}

_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_I = cast(Table, Interaction.__table__)

# The five statements, built once (SQLAlchemy caches their compiled form).
CORE_SESSION = select(_S).where(
    _S.c.workspace_id == bindparam("ws"), _S.c.session_id == bindparam("sid")
)
CORE_TURN = select(_T).where(
    _T.c.workspace_id == bindparam("ws"),
    _T.c.session_id == bindparam("sid"),
    _T.c.turn_id == bindparam("tid"),
)
CORE_LATEST = (
    select(_T)
    .where(
        _T.c.workspace_id == bindparam("ws"),
        _T.c.session_id == bindparam("sid"),
        _T.c.retracted_at_unix_ms.is_(None),
    )
    .order_by(_T.c.created_at_unix_ms.desc(), _T.c.turn_id.desc())
    .limit(1)
)
CORE_PENDING = (
    select(_I)
    .where(
        _I.c.workspace_id == bindparam("ws"),
        _I.c.session_id == bindparam("sid"),
        _I.c.status == "pending",
        _I.c.actionable.is_(True),
    )
    .order_by(_I.c.created_at_unix_ms, _I.c.turn_id, _I.c.request_id)
)
CORE_TREE = (
    select(_S)
    .where(
        _S.c.workspace_id == bindparam("ws"),
        _S.c.root_session_id == bindparam("root"),
        _S.c.deleted_at_unix_ms.is_(None),
    )
    .order_by(_S.c.created_at_unix_ms, _S.c.session_id)
)

# The five as one statement; the tree's root and the active Turn by scalar subquery.
_KEY = (_S.c.workspace_id == bindparam("ws"), _S.c.session_id == bindparam("sid"))
UNION = ReadUnion(
    session=UnionPart(select(_S).where(*_KEY)),
    turn=UnionPart(
        select(_T).where(
            _T.c.workspace_id == bindparam("ws"),
            _T.c.session_id == bindparam("sid"),
            _T.c.turn_id == select(_S.c.active_turn_id).where(*_KEY).scalar_subquery(),
        )
    ),
    latest=UnionPart(
        CORE_LATEST.limit(None).order_by(None),
        order_by=(_T.c.created_at_unix_ms.desc(), _T.c.turn_id.desc()),
        limit=1,
    ),
    pending=UnionPart(
        CORE_PENDING.order_by(None),
        order_by=(_I.c.created_at_unix_ms, _I.c.turn_id, _I.c.request_id),
    ),
    tree=UnionPart(
        select(_S).where(
            _S.c.workspace_id == bindparam("ws"),
            _S.c.root_session_id == select(_S.c.root_session_id).where(*_KEY).scalar_subquery(),
            _S.c.deleted_at_unix_ms.is_(None),
        ),
        order_by=(_S.c.created_at_unix_ms, _S.c.session_id),
    ),
)

# The same statements as plain SQL for the drivers used directly (named / positional).
_RAW = {
    "session": "SELECT * FROM sessions WHERE workspace_id = {ws} AND session_id = {sid}",
    "turn": "SELECT * FROM turns WHERE workspace_id = {ws} AND session_id = {sid} "
    "AND turn_id = {tid}",
    "latest": "SELECT * FROM turns WHERE workspace_id = {ws} AND session_id = {sid} "
    "AND retracted_at_unix_ms IS NULL ORDER BY created_at_unix_ms DESC, turn_id DESC LIMIT 1",
    "pending": "SELECT * FROM interactions WHERE workspace_id = {ws} AND session_id = {sid} "
    "AND status = 'pending' AND actionable ORDER BY created_at_unix_ms, turn_id, request_id",
    "tree": "SELECT * FROM sessions WHERE workspace_id = {ws} AND root_session_id = {root} "
    "AND deleted_at_unix_ms IS NULL ORDER BY created_at_unix_ms, session_id",
}


def _sql(style: str) -> dict[str, str]:
    """The raw statements with ``:name`` (sqlite3) or ``%(name)s`` (psycopg) parameters."""
    names = ("ws", "sid", "tid", "root")
    markers = {name: (f":{name}" if style == "named" else f"%({name})s") for name in names}
    return {key: text.format(**markers) for key, text in _RAW.items()}


# ------------------------------------------------------------------------------- seed


def seed(url: str) -> None:
    """One root Session with an active Turn, two settled Turns and one pending Interaction."""
    engine = create_engine(url)
    now = 1_700_000_000_000
    with engine.begin() as connection:
        connection.execute(
            insert(_S).values(
                workspace_id=WORKSPACE,
                session_id=SESSION,
                root_session_id=SESSION,
                provider="bench",
                title="bench",
                rail_section_key="conversations",
                settings_json="{}",
                capabilities_json="{}",
                message_version=0,
                next_message_sequence=1,
                created_at_unix_ms=now,
                updated_at_unix_ms=now,
                tombstone_legacy=False,
            )
        )
        for n in (1, 2, 3):
            connection.execute(
                insert(_T).values(
                    workspace_id=WORKSPACE,
                    session_id=SESSION,
                    turn_id=f"t-{n}",
                    phase="running" if n == 3 else "settled",
                    outcome=None if n == 3 else "completed",
                    origin="user",
                    version=1,
                    created_at_unix_ms=now + n,
                    updated_at_unix_ms=now + n,
                    result_resolved_empty=False,
                )
            )
        connection.execute(
            update(_S).where(_S.c.session_id == SESSION).values(active_turn_id="t-3")
        )
        connection.execute(
            insert(_I).values(
                workspace_id=WORKSPACE,
                session_id=SESSION,
                turn_id="t-3",
                request_id="q-1",
                kind="approval",
                status="pending",
                actionable=True,
                version=1,
                occurred_at_unix_ms=now,
                created_at_unix_ms=now,
                updated_at_unix_ms=now,
            )
        )
    engine.dispose()


# ----------------------------------------------------------------------------- stacks


async def host_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """Host's own GetSession read (``get_session``, whatever path it takes)."""
    from services.host.context import HostContext
    from services.host.sessions.commands import get_session
    from services.host.wire.command_codec import ProtoCommandCodec
    from store.database import Database

    db = Database(url)
    await db.start()
    ctx = HostContext(database=db, command_codec=ProtoCommandCodec())

    async def read() -> int:
        detail = await get_session(ctx, WORKSPACE, SESSION)
        return 1 + len(detail.pending_interactions) + len(detail.children)

    return read, db.stop


async def core_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """SQLAlchemy Core on an ``AsyncConnection``, statements built once."""
    engine = create_async_engine_for(url)
    params = {"ws": WORKSPACE, "sid": SESSION}

    async def read() -> int:
        async with engine.connect() as connection:
            session = (await connection.execute(CORE_SESSION, params)).one()
            await connection.execute(CORE_TURN, {**params, "tid": session.active_turn_id})
            await connection.execute(CORE_LATEST, params)
            pending = (await connection.execute(CORE_PENDING, params)).all()
            tree = (
                await connection.execute(
                    CORE_TREE, {"ws": WORKSPACE, "root": session.root_session_id}
                )
            ).all()
            await connection.rollback()
        return 1 + len(pending) + len(tree)

    return read, engine.dispose


async def core_thread_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """SQLAlchemy Core on a *sync* engine, the whole transaction in one hop to a thread."""
    engine = create_engine(url, pool_size=CONNECTIONS)
    params = {"ws": WORKSPACE, "sid": SESSION}

    def transaction() -> int:
        with engine.connect() as connection:
            session = connection.execute(CORE_SESSION, params).one()
            connection.execute(CORE_TURN, {**params, "tid": session.active_turn_id}).first()
            connection.execute(CORE_LATEST, params).first()
            pending = connection.execute(CORE_PENDING, params).all()
            tree = connection.execute(
                CORE_TREE, {"ws": WORKSPACE, "root": session.root_session_id}
            ).all()
            connection.rollback()
        return 1 + len(pending) + len(tree)

    executor = ThreadPoolExecutor(max_workers=CONNECTIONS)
    loop = asyncio.get_running_loop()

    async def read() -> int:
        return await loop.run_in_executor(executor, transaction)

    async def close() -> None:
        executor.shutdown()
        engine.dispose()

    return read, close


def _on_dedicated_threads(
    transaction: Callable[[], int],
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """Run ``transaction`` on one of ``CONNECTIONS`` single-thread executors, one hop a call.

    Each thread keeps its own connection in a thread-local.
    """
    executors = [ThreadPoolExecutor(max_workers=1) for _ in range(CONNECTIONS)]
    free: asyncio.Queue[ThreadPoolExecutor] = asyncio.Queue()
    for executor in executors:
        free.put_nowait(executor)
    loop = asyncio.get_running_loop()

    async def read() -> int:
        executor = await free.get()
        try:
            return await loop.run_in_executor(executor, transaction)
        finally:
            free.put_nowait(executor)

    async def close() -> None:
        for executor in executors:
            executor.shutdown()

    return read, close


async def sqlite3_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """The stdlib driver; one thread hop per transaction, one thread per connection."""
    path = url.removeprefix("sqlite:///")
    sql = _sql("named")
    local = threading.local()

    def connection() -> sqlite3.Connection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.row_factory = sqlite3.Row
            local.conn = conn
        return conn

    def transaction() -> int:
        conn = connection()
        conn.execute("BEGIN")
        try:
            params = {"ws": WORKSPACE, "sid": SESSION}
            session = conn.execute(sql["session"], params).fetchone()
            conn.execute(sql["turn"], {**params, "tid": session["active_turn_id"]}).fetchone()
            conn.execute(sql["latest"], params).fetchone()
            pending = conn.execute(sql["pending"], params).fetchall()
            tree = conn.execute(
                sql["tree"], {"ws": WORKSPACE, "root": session["root_session_id"]}
            ).fetchall()
        finally:
            conn.execute("ROLLBACK")
        return 1 + len(pending) + len(tree)

    return _on_dedicated_threads(transaction)


async def psycopg_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """Psycopg 3 ``AsyncConnection`` directly, prepared statements, four connections."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    sql = _sql("pyformat")
    connections = [await psycopg.AsyncConnection.connect(conninfo) for _ in range(CONNECTIONS)]
    free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for conn in connections:
        free.put_nowait(conn)

    async def read() -> int:
        conn = await free.get()
        try:
            params = {"ws": WORKSPACE, "sid": SESSION}
            async with conn.transaction():
                cur = await conn.execute(sql["session"], params, prepare=True)
                session = await cur.fetchone()
                assert session is not None
                columns = [d.name for d in cur.description or ()]
                row = dict(zip(columns, session, strict=True))
                await (
                    await conn.execute(
                        sql["turn"], {**params, "tid": row["active_turn_id"]}, prepare=True
                    )
                ).fetchone()
                await (await conn.execute(sql["latest"], params, prepare=True)).fetchone()
                pending = await (
                    await conn.execute(sql["pending"], params, prepare=True)
                ).fetchall()
                tree = await (
                    await conn.execute(
                        sql["tree"], {"ws": WORKSPACE, "root": row["root_session_id"]}, prepare=True
                    )
                ).fetchall()
            return 1 + len(pending) + len(tree)
        finally:
            free.put_nowait(conn)

    async def close() -> None:
        for conn in connections:
            await conn.close()

    return read, close


async def psycopg_thread_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """Psycopg 3's sync ``Connection``, prepared statements, the transaction in one thread hop."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    sql = _sql("pyformat")
    local = threading.local()

    def transaction() -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.Connection.connect(conninfo)
        params = {"ws": WORKSPACE, "sid": SESSION}
        with conn.transaction():
            cur = conn.execute(sql["session"], params, prepare=True)
            session = cur.fetchone()
            assert session is not None
            columns = [d.name for d in cur.description or ()]
            row = dict(zip(columns, session, strict=True))
            conn.execute(sql["turn"], {**params, "tid": row["active_turn_id"]}, prepare=True)
            conn.execute(sql["latest"], params, prepare=True).fetchone()
            pending = conn.execute(sql["pending"], params, prepare=True).fetchall()
            tree = conn.execute(
                sql["tree"], {"ws": WORKSPACE, "root": row["root_session_id"]}, prepare=True
            ).fetchall()
        return 1 + len(pending) + len(tree)

    return _on_dedicated_threads(transaction)


async def psycopg_union_stack(
    url: str,
) -> tuple[Callable[[], Awaitable[int]], Callable[[], Awaitable[None]]]:
    """The read set as one ``UNION ALL`` statement in autocommit, psycopg's raw cursor."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    compiled = UNION.compiled("postgresql")
    local = threading.local()

    def statement() -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = psycopg.Connection.connect(
                conninfo, autocommit=True, cursor_factory=psycopg.RawCursor
            )
        params = compiled.bind({"ws": WORKSPACE, "sid": SESSION})
        parts = compiled.decode(conn.execute(compiled.sql, params, prepare=True).fetchall())
        assert parts["session"]
        return sum(len(rows) for rows in parts.values())

    return _on_dedicated_threads(statement)


FACTORIES = {
    "psycopg-thread": psycopg_thread_stack,
    "psycopg-union": psycopg_union_stack,
    "host": host_stack,
    "core": core_stack,
    "core-thread": core_thread_stack,
    "sqlite3-thread": sqlite3_stack,
    "psycopg": psycopg_stack,
}


async def run_worker(stack: str, url: str, calls: int) -> dict[str, float]:
    """Run ``calls`` read transactions at concurrency 32; throughput and CPU per call."""
    read, close = await FACTORIES[stack](url)
    for _ in range(50):  # warm-up: connections, statement caches, prepared statements
        await read()
    remaining = calls
    latencies: list[float] = []

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await read()
            latencies.append(time.perf_counter() - started)

    cpu_before = cpu_seconds(os.getpid())
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(os.getpid()) - cpu_before
    await close()
    latencies.sort()
    return {
        "throughput_per_s": calls / elapsed,
        "cpu_ms_per_call": 1000 * cpu / calls,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def measure(stack: str, url: str, calls: int) -> dict[str, float]:
    """One round of one stack, in its own process."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.storage_stack_bench",
            "--worker",
            stack,
            "--url",
            url,
            "--calls",
            str(calls),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Run every stack of every backend interleaved; print medians and ratios; write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(asyncio.run(run_worker(args.worker, args.url, args.calls))))
        return
    report: dict[str, Any] = {
        "benchmark": "storage_stack_bench",
        "command": " ".join([sys.executable, "-m", "bench.storage_stack_bench", *sys.argv[1:]]),
        "calls": args.calls,
        "rounds": args.rounds,
        "concurrency": CONCURRENCY,
        "cpus": os.cpu_count(),
        "recorded_at_unix_ms": int(time.time() * 1000),
        "backends": {},
    }
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
            seed(url)
            samples: dict[str, list[dict[str, float]]] = {stack: [] for stack in STACKS[backend]}
            for round_no in range(args.rounds):
                for stack in STACKS[backend]:
                    result = measure(stack, url, args.calls)
                    samples[stack].append(result)
                    print(
                        f"[{backend}] round {round_no + 1} {stack}: "
                        f"{result['throughput_per_s']:.0f}/s, "
                        f"{result['cpu_ms_per_call']:.2f} ms CPU",
                        flush=True,
                    )
            medians = {
                stack: {key: statistics.median(sample[key] for sample in runs) for key in runs[0]}
                for stack, runs in samples.items()
            }
            base = medians["host"]["throughput_per_s"]
            for stack, figures in medians.items():
                figures["ratio_to_host"] = figures["throughput_per_s"] / base
                print(
                    f"[{backend}] {stack}: {figures['throughput_per_s']:.0f}/s median, "
                    f"p50 {figures['p50_ms']:.1f} ms, "
                    f"{figures['cpu_ms_per_call']:.2f} ms CPU/call, "
                    f"{figures['ratio_to_host']:.2f} x host"
                )
            report["backends"][backend] = {"medians": medians, "samples": samples}
    print(f"wrote {write_results('storage_stack_bench', report)}")


if __name__ == "__main__":
    main()
