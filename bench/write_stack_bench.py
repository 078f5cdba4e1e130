"""The storage stack under Host's small write transactions, side by side (ADR 0034).

Run: ``.venv/bin/python -m bench.write_stack_bench [--backends sqlite,postgres]
[--calls N] [--rounds R]``

Two transactions (``--transactions``):

* ``ack`` — a runtime's command acknowledgement (one per ``SendInput``): the outbox row read
  under its lock, deleted (an ``accepted`` acknowledgement), and the bounded prune of settled
  deliveries — three statements. Every call acknowledges its own seeded ``dispatched`` command.
* ``submit`` — the rows of a ``SendInput new_turn`` submit transaction, as a model of what
  Host writes (not Host's code): the Session read under its lock, the replay check, the
  agent-target read, the Turn insert, the Session update, the user message insert, the
  Session's pending commands read under lock, the dispatched command insert, the cursor-state
  read, and the two events appended by Host's own append (``activity_events.append_events``:
  the workspace head row bumped, the rows inserted with their sequence) — each call on its
  own seeded Session. It measured what the submit would cost on each stack before Host's
  submit moved (ADR 0034); Host's submit now also folds its statements (ADR 0045).

Every transaction runs ``--calls`` calls at concurrency 32 from one event loop, **each
stack in its own process** (this module started with ``--worker``), on the same migrated
database (a temporary SQLite file; a scratch Postgres database, dropped after). The stacks
run interleaved for ``--rounds`` rounds; the medians are reported with each stack's
throughput ratio to the ORM path and its CPU time per transaction.

Stacks:

* ``orm`` — the ORM ``AsyncSession`` through ``store.transactions.TransactionRunner``
  (SQLite: aiosqlite, one thread hop per statement and for ``BEGIN``/``COMMIT``; Postgres:
  psycopg's async connection), rows loaded, added and deleted through the unit of work: for
  ``ack`` the path before ADR 0034, for ``submit`` the path Host's submit took before it;
* ``core`` (``ack`` only) — the same statements as SQLAlchemy Core on an ``AsyncConnection``;
* ``direct`` — ``store.direct_writes.DirectWrites``: the transaction as one synchronous
  function on a writer thread, one hop per transaction (for ``ack`` Host's path now,
  ``services.host.repository.command_acks.record_ack``);
* ``psycopg`` (Postgres, ``ack`` only) — psycopg 3's ``AsyncConnection`` used directly, four
  connections, prepared statements, the same SQL.

The JSON (``bench/results/write_stack_bench.json``) records the command line and every
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import psycopg
from sqlalchemy import Table, bindparam, create_engine, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from bench.host_bench import cpu_seconds, database
from bench.stats import write_results
from bench.storage_stack_bench import SESSION, WORKSPACE, seed
from services.host.repository.activity_events import (
    EventLogRepository,
    NewEventRow,
    append_events,
)
from store.engine import create_async_engine_for
from store.models import ActivityEvent, AgentTarget, Message, RuntimeCommandOutbox, Session, Turn

CONCURRENCY = 32
CONNECTIONS = 4
WARMUP = 50
STACKS = {
    ("ack", "sqlite"): ("orm", "core", "direct"),
    ("ack", "postgres"): ("orm", "core", "direct", "psycopg"),
    ("submit", "sqlite"): ("orm", "direct"),
    ("submit", "postgres"): ("orm", "direct"),
}

_C = cast(Table, RuntimeCommandOutbox.__table__)
_S = cast(Table, Session.__table__)
_T = cast(Table, Turn.__table__)
_M = cast(Table, Message.__table__)
_E = cast(Table, ActivityEvent.__table__)
_A = cast(Table, AgentTarget.__table__)


def _statements() -> tuple[Any, Any, Any]:
    """Host's statements (``command_acks``): the locked read, the prune's ids, the prune."""
    from services.host.repository import command_acks

    return (
        command_acks._COMMAND.statement,
        command_acks._SETTLED_DELIVERIES,
        command_acks._PRUNE_SETTLED.statement,
    )


def seed_commands(url: str, prefix: str, count: int) -> None:
    """``count`` dispatched commands of the bench Session, ids ``<prefix>-<n>``."""
    engine = create_engine(url)
    rows = [
        {
            "workspace_id": WORKSPACE,
            "session_id": SESSION,
            "command_id": f"{prefix}-{n}",
            "command_kind": "start_turn",
            "operation_id": None,
            "payload_json": "{}",
            "state": "dispatched",
            "attempts": 1,
            "next_attempt_at_unix_ms": 1,
            "created_at_unix_ms": 1,
            "updated_at_unix_ms": 1,
        }
        for n in range(count)
    ]
    with engine.begin() as connection:
        connection.execute(insert(_C), rows)
    engine.dispose()


def seed_sessions(url: str, prefix: str, count: int) -> None:
    """``count`` idle Sessions, ids ``<prefix>-<n>``."""
    engine = create_engine(url)
    rows = [
        {
            "workspace_id": WORKSPACE,
            "session_id": f"{prefix}-{n}",
            "root_session_id": f"{prefix}-{n}",
            "agent_target_id": "bench-target",
            "provider": "bench",
            "title": "bench",
            "rail_section_key": "conversations",
            "settings_json": "{}",
            "capabilities_json": "{}",
            "message_version": 0,
            "next_message_sequence": 1,
            "created_at_unix_ms": 1,
            "updated_at_unix_ms": 1,
            "tombstone_legacy": False,
        }
        for n in range(count)
    ]
    with engine.begin() as connection:
        connection.execute(insert(_S), rows)
    engine.dispose()


Stack = tuple[Callable[[str], Awaitable[None]], Callable[[], Awaitable[None]]]


async def orm_stack(url: str) -> Stack:
    """The ORM unit of work through ``TransactionRunner`` (the path before ADR 0034)."""
    from store.transactions import TransactionRunner

    engine = create_async_engine_for(url)
    runner = TransactionRunner(engine, scope=lambda session, _uow: session)
    by_id = (
        select(RuntimeCommandOutbox)
        .where(RuntimeCommandOutbox.command_id == bindparam("command_id"))
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    _, settled, _ = _statements()  # the prune's ids read first, then deleted, as before

    async def ack(command_id: str) -> None:
        async def command(session: AsyncSession) -> None:
            row = (await session.execute(by_id, {"command_id": command_id})).scalars().first()
            assert row is not None
            row.state = "completed"
            await session.delete(row)
            ids = list((await session.execute(settled)).scalars())
            if ids:
                await session.execute(delete(RuntimeCommandOutbox).where(_C.c.id.in_(ids)))

        await runner.run(command)

    return ack, engine.dispose


async def core_stack(url: str) -> Stack:
    """The same statements as Core on an ``AsyncConnection``."""
    from store.engine import SQLITE_BEGIN_OPTION, sqlite_write_slot

    engine = create_async_engine_for(url)
    locked, _, prune = _statements()
    remove = delete(_C).where(_C.c.id == bindparam("row_id"))

    async def ack(command_id: str) -> None:
        async with sqlite_write_slot(engine), engine.connect() as connection:
            connection = await connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            async with connection.begin():
                row = (await connection.execute(locked, {"command_id": command_id})).first()
                assert row is not None
                await connection.execute(remove, {"row_id": row.id})
                await connection.execute(prune)

    return ack, engine.dispose


async def direct_stack(url: str) -> Stack:
    """Host's acknowledgement on ``DirectWrites`` (one hop per transaction)."""
    from services.host.repository import command_acks
    from store.direct_writes import DirectWrites

    engine = create_async_engine_for(url)
    writes = DirectWrites(url, engine)

    async def ack(command_id: str) -> None:
        outcome = await writes.run(
            lambda conn: command_acks.record_ack(conn, command_id, "accepted", None, 2)
        )
        assert outcome.found

    async def close() -> None:
        await writes.close()
        await engine.dispose()

    return ack, close


async def psycopg_stack(url: str) -> Stack:
    """Psycopg 3's ``AsyncConnection`` directly, prepared statements, four connections."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    locked, _, prune = _statements()
    from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

    dialect = pg_psycopg.dialect()  # type: ignore[no-untyped-call]
    read_sql = str(locked.compile(dialect=dialect))
    prune_compiled = prune.compile(dialect=dialect)
    prune_sql, prune_params = str(prune_compiled), dict(prune_compiled.params)
    connections = [await psycopg.AsyncConnection.connect(conninfo) for _ in range(CONNECTIONS)]
    free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    for conn in connections:
        free.put_nowait(conn)

    async def ack(command_id: str) -> None:
        conn = await free.get()
        try:
            async with conn.transaction():
                cursor = await conn.execute(read_sql, {"command_id": command_id}, prepare=True)
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(
                    "DELETE FROM runtime_command_outbox WHERE id = %(row_id)s",
                    {"row_id": row[0]},
                    prepare=True,
                )
                await conn.execute(prune_sql, prune_params, prepare=True)
        finally:
            free.put_nowait(conn)

    async def close() -> None:
        for conn in connections:
            await conn.close()

    return ack, close


# ------------------------------------------------------------------ the submit model


def _submit_values(session_id: str, now: int) -> dict[str, Any]:
    turn_id = f"turn-{session_id}"
    return {
        "turn": {
            "workspace_id": WORKSPACE,
            "session_id": session_id,
            "turn_id": turn_id,
            "client_submit_id": f"c-{session_id}",
            "submit_fingerprint": "f" * 64,
            "phase": "queued",
            "origin": "user",
            "delivery": "new_turn",
            "mode": "default",
            "version": 1,
            "created_at_unix_ms": now,
            "updated_at_unix_ms": now,
            "result_resolved_empty": False,
        },
        "message": {
            "workspace_id": WORKSPACE,
            "session_id": session_id,
            "message_id": f"client-submit:user:c-{session_id}",
            "sequence": 1,
            "version": 1,
            "turn_id": turn_id,
            "occurred_at_unix_ms": now,
            "created_at_unix_ms": now,
            "updated_at_unix_ms": now,
            "role": "user",
            "kind": "text",
            "payload_json": '{"text": "hello"}',
            "user_visible_assistant_response": False,
        },
        "command": {
            "workspace_id": WORKSPACE,
            "session_id": session_id,
            "command_id": f"cmd-{session_id}",
            "command_kind": "start_turn",
            "operation_id": None,
            "payload_json": '{"turnId": "' + turn_id + '"}',
            "state": "dispatched",
            "attempts": 1,
            "next_attempt_at_unix_ms": now,
            "created_at_unix_ms": now,
            "updated_at_unix_ms": now,
        },
        "events": [
            {
                "workspace_id": WORKSPACE,
                "session_id": session_id,
                "event_type": kind,
                "payload": b"x" * 300,
                "created_at_unix_ms": now,
            }
            for kind in ("turn_update", "message_update")
        ],
    }


def _event_rows(values: dict[str, Any]) -> list[NewEventRow]:
    return [NewEventRow(**event) for event in values["events"]]


_KEY = (_S.c.workspace_id == bindparam("ws"), _S.c.session_id == bindparam("sid"))
_LOCK_SESSION = select(_S).where(*_KEY).with_for_update()
_REPLAY = select(_M.c.message_id).where(
    _M.c.workspace_id == bindparam("ws"),
    _M.c.session_id == bindparam("sid"),
    _M.c.message_id == bindparam("mid"),
)
_TARGET = select(_A).where(
    _A.c.workspace_id == bindparam("ws"), _A.c.agent_target_id == bindparam("target")
)
_PENDING = (
    select(_C.c.id)
    .where(
        _C.c.workspace_id == bindparam("ws"),
        _C.c.session_id == bindparam("sid"),
        _C.c.state == "pending",
    )
    .order_by(_C.c.id)
    .with_for_update()
)
_CURSOR = select(_S.c.active_turn_id, _S.c.message_version).where(*_KEY)
_SET_ACTIVE = (
    update(_S)
    .where(*_KEY)
    .values(
        active_turn_id=bindparam("tid"),
        updated_at_unix_ms=bindparam("now"),
        next_message_sequence=bindparam("next_seq"),
        message_version=bindparam("version"),
    )
)


async def orm_submit_stack(url: str) -> Stack:
    """The submit's rows through the ORM unit of work, as Host writes them today."""
    from store.transactions import TransactionRunner

    engine = create_async_engine_for(url)
    runner = TransactionRunner(engine, scope=lambda session, _uow: session)
    lock_orm = select(Session).where(*_KEY).with_for_update()

    async def submit(session_id: str) -> None:
        values = _submit_values(session_id, 2)
        key = {"ws": WORKSPACE, "sid": session_id}

        async def command(db: AsyncSession) -> None:
            row = (await db.execute(lock_orm, key)).scalar_one()
            mid = values["message"]["message_id"]
            assert (await db.get(Message, (WORKSPACE, session_id, mid))) is None
            await db.execute(_TARGET, {"ws": WORKSPACE, "target": row.agent_target_id})
            db.add(Turn(**values["turn"]))
            await db.flush()
            row.active_turn_id = values["turn"]["turn_id"]
            row.updated_at_unix_ms = 2
            row.next_message_sequence += 1
            row.message_version += 1
            db.add(Message(**values["message"]))
            list((await db.execute(_PENDING, key)).scalars())
            db.add(RuntimeCommandOutbox(**values["command"]))
            await db.flush()
            (await db.execute(_CURSOR, key)).one()
            appended = await EventLogRepository(db).append(_event_rows(values))
            assert len(appended[WORKSPACE].ids) == 2

        await runner.run(command)

    return submit, engine.dispose


async def direct_submit_stack(url: str) -> Stack:
    """The same rows as one synchronous function on ``DirectWrites`` (one hop)."""
    from store.direct_reads import ReadQuery
    from store.direct_writes import DirectWrites, WriteConnection, WriteStatement

    engine = create_async_engine_for(url)
    writes = DirectWrites(url, engine)
    lock_session, replay, target = ReadQuery(_LOCK_SESSION), ReadQuery(_REPLAY), ReadQuery(_TARGET)
    pending, cursor = ReadQuery(_PENDING), ReadQuery(_CURSOR)
    set_active = WriteStatement(_SET_ACTIVE)
    shape = _submit_values("-", 0)

    def add(table: Table, row: dict[str, Any]) -> Any:
        # The row's own columns as parameters: the database assigns the rest (ids).
        return insert(table).values({name: bindparam(name) for name in row})

    add_turn = WriteStatement(add(_T, shape["turn"]))
    add_message = WriteStatement(add(_M, shape["message"]))
    add_command = WriteStatement(add(_C, shape["command"]))

    def transaction(conn: WriteConnection, session_id: str) -> None:
        values = _submit_values(session_id, 2)
        key = {"ws": WORKSPACE, "sid": session_id}
        row = conn.first(lock_session, key)
        assert row is not None
        mid = values["message"]["message_id"]
        assert conn.first(replay, {**key, "mid": mid}) is None
        conn.first(target, {"ws": WORKSPACE, "target": row.agent_target_id})
        conn.execute(add_turn, values["turn"])
        conn.execute(
            set_active,
            {
                **key,
                "tid": values["turn"]["turn_id"],
                "now": 2,
                "next_seq": row.next_message_sequence + 1,
                "version": row.message_version + 1,
            },
        )
        conn.execute(add_message, values["message"])
        conn.first(pending, key)
        conn.execute(add_command, values["command"])
        conn.first(cursor, key)
        appended = append_events(conn, _event_rows(values))
        assert len(appended[WORKSPACE].ids) == 2

    async def submit(session_id: str) -> None:
        await writes.run(lambda conn: transaction(conn, session_id))

    async def close() -> None:
        await writes.close()
        await engine.dispose()

    return submit, close


FACTORIES: dict[tuple[str, str], Callable[[str], Awaitable[Stack]]] = {
    ("ack", "orm"): orm_stack,
    ("ack", "core"): core_stack,
    ("ack", "direct"): direct_stack,
    ("ack", "psycopg"): psycopg_stack,
    ("submit", "orm"): orm_submit_stack,
    ("submit", "direct"): direct_submit_stack,
}


async def run_worker(
    transaction: str, stack: str, url: str, prefix: str, calls: int
) -> dict[str, float]:
    """Run ``calls`` transactions at concurrency 32, each on its own seeded row."""
    ack, close = await FACTORIES[(transaction, stack)](url)
    for n in range(WARMUP):  # connections, statement caches, prepared statements
        await ack(f"{prefix}-{calls + n}")
    ids = [f"{prefix}-{n}" for n in range(calls)]
    ids.reverse()
    latencies: list[float] = []

    async def client() -> None:
        while ids:
            command_id = ids.pop()
            started = time.perf_counter()
            await ack(command_id)
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


def measure(transaction: str, stack: str, url: str, prefix: str, calls: int) -> dict[str, float]:
    """One round of one stack, in its own process, on freshly seeded rows."""
    if transaction == "ack":
        seed_commands(url, prefix, calls + WARMUP)
    else:
        seed_sessions(url, prefix, calls + WARMUP)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.write_stack_bench",
            "--worker",
            stack,
            "--transactions",
            transaction,
            "--url",
            url,
            "--prefix",
            prefix,
            "--calls",
            str(calls),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"the {stack} worker for {transaction} exited with {out.returncode}:\n"
            + "\n".join(out.stderr.strip().splitlines()[-15:])
        )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Run every stack of every backend interleaved; print medians and ratios; write the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--transactions", default="ack,submit")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        figures = asyncio.run(
            run_worker(args.transactions, args.worker, args.url, args.prefix, args.calls)
        )
        print(json.dumps(figures))
        return
    report: dict[str, Any] = {
        "benchmark": "write_stack_bench",
        "command": " ".join([sys.executable, "-m", "bench.write_stack_bench", *sys.argv[1:]]),
        "transactions": {
            "ack": "command acknowledgement (locked read, delete, bounded prune)",
            "submit": "model of a SendInput new_turn submit's rows, events by Host's append",
        },
        "calls": args.calls,
        "rounds": args.rounds,
        "concurrency": CONCURRENCY,
        "cpus": os.cpu_count(),
        "recorded_at_unix_ms": int(time.time() * 1000),
        "backends": {},
    }
    transactions = [t.strip() for t in args.transactions.split(",") if t.strip()]
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        with tempfile.TemporaryDirectory() as tmp, database(backend, Path(tmp)) as url:
            seed(url)
            for transaction in transactions:
                stacks = STACKS[(transaction, backend)]
                samples: dict[str, list[dict[str, float]]] = {stack: [] for stack in stacks}
                for round_no in range(args.rounds):
                    for stack in stacks:
                        prefix = f"{transaction}-{stack}-{round_no}"
                        result = measure(transaction, stack, url, prefix, args.calls)
                        samples[stack].append(result)
                        print(
                            f"[{backend} {transaction}] round {round_no + 1} {stack}: "
                            f"{result['throughput_per_s']:.0f}/s, "
                            f"{result['cpu_ms_per_call']:.2f} ms CPU",
                            flush=True,
                        )
                medians = {
                    stack: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
                    for stack, runs in samples.items()
                }
                base = medians["orm"]["throughput_per_s"]
                base_cpu = medians["orm"]["cpu_ms_per_call"]
                for stack, figures in medians.items():
                    figures["ratio_to_orm"] = figures["throughput_per_s"] / base
                    figures["cpu_ratio_to_orm"] = figures["cpu_ms_per_call"] / base_cpu
                    print(
                        f"[{backend} {transaction}] {stack}: "
                        f"{figures['throughput_per_s']:.0f}/s median, "
                        f"p50 {figures['p50_ms']:.1f} ms, "
                        f"{figures['cpu_ms_per_call']:.2f} ms CPU/call, "
                        f"{figures['ratio_to_orm']:.2f} x orm"
                    )
                report["backends"].setdefault(backend, {})[transaction] = {
                    "medians": medians,
                    "samples": samples,
                }
    print(f"wrote {write_results('write_stack_bench', report)}")


if __name__ == "__main__":
    main()
