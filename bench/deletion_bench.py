"""Delete, restore and purge at scale, on SQLite and Postgres in one run (HOST-DEL-*).

Run: ``.venv/bin/python -m bench.deletion_bench [--backends sqlite,postgres]
[--parts purge,grpc_purge,delete_restore,listing] [--purge-rounds 5] [--rounds 5]
[--postgres-admin-url URL]``.

For each backend, on fresh migrated databases:

* **purge** — 2,000 restorable tombstone trees (5 Sessions each) holding 200,000 message
  rows are removed by ``PurgeDeletedSessions`` (the domain call: read scans of 1,000
  candidates classified from component aggregates, then fenced write transactions of up to
  256 whole trees / 20,000 rows with their cleanup-outbox rows). The baseline is a raw
  ``DELETE FROM sessions WHERE ... deleted_at_unix_ms IS NOT NULL`` of the same rows (seeded
  again) in one transaction, with the same cascades. Each round runs both on a fresh
  database, alternating which goes first; reported per round and as medians: canonical rows
  per second and the ratio ours/raw (target: median ratio >= 0.5).
* **grpc_purge** — the same 2,000 trees removed the way maintenance removes them: a real host
  process (``tutti serve host``, default settings) and ``PurgeDeletedSessions`` over gRPC with
  maintenance's bounds (100 trees / 10,000 rows per call) in a loop until nothing remains.
  The baseline is the same raw ``DELETE`` in a process of its own (``--raw-delete URL``).
  Both sides start from identical rows: the set is seeded once into a template per backend
  and cloned for each side (SQLite: a file copy; Postgres: ``CREATE DATABASE ... TEMPLATE``).
  Rounds alternate which side goes first; reported per round and as medians: rows per
  second, the ratio ours/raw (target >= 0.5) and the number of calls.
* **delete + restore** — one 5,000-Session tree (root, 50 children, 99 grandchildren each)
  deleted with ``DeleteSessions`` and restored with ``RestoreDeletedSession``: latency.
* **listing** — ``ListDeletedSessions`` first page (50 items) over 100,000 topmost
  tombstones, without and with ``total_count`` (counted only when asked): latency, and the
  query plan of the page statement, which must name the ``ix_sessions_tombstone_listing``
  index.

Results go to ``bench/results/deletion_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import create_engine, func, insert, select, text
from sqlalchemy.pool import NullPool

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from bench.host_bench import metadata, start_host
from bench.stats import Summary, summarize, write_results
from services.host.context import HostContext
from services.host.deletion import delete, purge, restore
from services.host.repository.deletion import DeletedListingQuery, DeletionRepository
from services.host.wire.command_codec import ProtoCommandCodec
from store import migrate
from store.database import Database
from store.engine import create_sync_engine_for
from store.models import Message, ResourceCleanupOutbox, Session

WS = "bench"
PURGE_TREES = 2_000
TREE_SIZE = 5
MESSAGES_PER_SESSION = 20  # 2,000 trees x 5 Sessions x 20 = 200,000 message rows
LISTING_TOMBSTONES = 100_000
INDEX = "ix_sessions_tombstone_listing"
TARGET_PURGE_RATIO = 0.5
MAINTENANCE_TREES = 100
MAINTENANCE_ROWS = 10_000
"""The bounds of one ``PurgeDeletedSessions`` call in the gRPC part (issue #15)."""
PARTS = ("purge", "grpc_purge", "delete_restore", "listing")


def _session_row(sid: str, parent: str | None, root: str, **extra: Any) -> dict[str, Any]:
    row = {
        "workspace_id": WS,
        "session_id": sid,
        "parent_session_id": parent,
        "root_session_id": root,
        "provider": "demo",
        "title": f"title {sid}",
        "rail_section_key": "conversations",
        "created_at_unix_ms": 1_000,
        "updated_at_unix_ms": 1_000,
        "deleted_at_unix_ms": None,
        "deletion_generation": None,
        "component_size": None,
    }
    row.update(extra)
    return row


def _bulk(url: str, model: Any, rows: list[dict[str, Any]]) -> None:
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            for start in range(0, len(rows), 10_000):
                connection.execute(insert(model), rows[start : start + 10_000])
    finally:
        engine.dispose()


def seed_purge_trees(url: str, trees: int = PURGE_TREES) -> int:
    """``trees`` restorable tombstone trees of 5 Sessions, 20 messages each; canonical rows."""
    sessions: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for tree in range(trees):
        root = f"p{tree:05d}"
        for member in range(TREE_SIZE):
            sid = root if member == 0 else f"{root}-{member}"
            sessions.append(
                _session_row(
                    sid,
                    None if member == 0 else root,
                    root,
                    deleted_at_unix_ms=10_000 + tree,
                    deletion_generation=f"g-{root}",
                    component_size=TREE_SIZE,
                    message_version=MESSAGES_PER_SESSION,
                    next_message_sequence=MESSAGES_PER_SESSION + 1,
                )
            )
            for index in range(MESSAGES_PER_SESSION):
                messages.append(
                    {
                        "workspace_id": WS,
                        "session_id": sid,
                        "message_id": f"m{index}",
                        "sequence": index + 1,
                        "version": index + 1,
                        "occurred_at_unix_ms": 1_000,
                        "created_at_unix_ms": 1_000,
                        "updated_at_unix_ms": 1_000,
                        "role": "assistant",
                        "kind": "text",
                        "payload_json": '{"text":"a benchmark message of moderate length"}',
                    }
                )
    _bulk(url, Session, sessions)
    _bulk(url, Message, messages)
    _analyze(url)
    return len(sessions) + len(messages)


def _analyze(url: str) -> None:
    """Refresh planner statistics after a bulk load, as autovacuum would (Postgres only)."""
    if not url.startswith("postgresql"):
        return
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("ANALYZE sessions"))
            connection.execute(text("ANALYZE messages"))
            connection.commit()
    finally:
        engine.dispose()


def raw_delete(url: str) -> float:
    """Seconds for the baseline: one raw DELETE of every tombstone (cascading)."""
    engine = create_sync_engine_for(url)
    try:
        started = time.perf_counter()
        with engine.begin() as connection:
            connection.execute(
                text(
                    "DELETE FROM sessions WHERE workspace_id = :ws"
                    " AND deleted_at_unix_ms IS NOT NULL AND parent_session_id IS NOT NULL"
                ),
                {"ws": WS},
            )
            connection.execute(
                text(
                    "DELETE FROM sessions WHERE workspace_id = :ws"
                    " AND deleted_at_unix_ms IS NOT NULL"
                ),
                {"ws": WS},
            )
        return time.perf_counter() - started
    finally:
        engine.dispose()


async def purge_seconds(url: str, rows: int, trees: int = PURGE_TREES) -> float:
    """Seconds for ``PurgeDeletedSessions`` of every seeded tree (the domain call)."""
    database = Database(url)
    await database.start()
    try:
        ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
        started = time.perf_counter()
        report = await purge.purge_deleted_sessions(
            ctx,
            WS,
            10**12,
            purge.PurgeBounds(max_trees=trees, max_rows=10**9, max_bytes=10**12),
        )
        ours = time.perf_counter() - started
    finally:
        await database.stop()
    assert report.purged_tree_count == trees, report.purged_tree_count
    assert report.purged_row_count == rows, (report.purged_row_count, rows)
    return ours


def bench_purge_round(
    fresh: Callable[[], tuple[str, Callable[[], None]]], number: int, trees: int = PURGE_TREES
) -> dict[str, Any]:
    """One round: ours and the raw ``DELETE`` of the same seeded rows.

    Each side runs on a fresh database (a second run in the same database works among the
    first run's dead rows), the order alternating between rounds so a drift of the machine
    favours neither.
    """
    seconds: dict[str, float] = {}
    rows = 0
    for side in ("ours", "raw") if number % 2 else ("raw", "ours"):
        url, drop = fresh()
        try:
            rows = seed_purge_trees(url, trees)
            seconds[side] = (
                asyncio.run(purge_seconds(url, rows, trees)) if side == "ours" else raw_delete(url)
            )
        finally:
            drop()
    ours_rate, raw_rate = rows / seconds["ours"], rows / seconds["raw"]
    return {
        "round": number,
        "purge_seconds": round(seconds["ours"], 3),
        "purge_rows_per_s": round(ours_rate),
        "raw_delete_seconds": round(seconds["raw"], 3),
        "raw_delete_rows_per_s": round(raw_rate),
        "ratio": round(ours_rate / raw_rate, 3),
    }


def summarize_purge(rounds: list[dict[str, Any]], trees: int = PURGE_TREES) -> dict[str, Any]:
    """The rounds with their medians; the verdict is on the median ratio."""
    return {
        "trees": trees,
        "rows": trees * TREE_SIZE * (MESSAGES_PER_SESSION + 1),
        "rounds": rounds,
        "purge_seconds_median": round(statistics.median(r["purge_seconds"] for r in rounds), 3),
        "raw_delete_seconds_median": round(
            statistics.median(r["raw_delete_seconds"] for r in rounds), 3
        ),
        "ratio_median": round(statistics.median(r["ratio"] for r in rounds), 3),
    }


# ------------------------------------------------------------------ purge over gRPC


class PurgeTemplate:
    """The purge set seeded once per backend and cloned for each side of a round.

    Cloning gives both sides identical rows and costs seconds instead of a fresh seed:
    SQLite copies the file, Postgres ``CREATE DATABASE ... TEMPLATE`` (statistics included).
    """

    def __init__(self, backend: str, admin_url: str, workdir: Path, trees: int) -> None:
        self.backend = backend
        self._admin_url = admin_url
        self._workdir = workdir
        self.url, self._drop = fresh_database(backend, admin_url, workdir)
        self.rows = seed_purge_trees(self.url, trees)
        self.trees = trees

    def clone(self) -> tuple[str, Callable[[], None]]:
        """A copy of the seeded database and its cleanup."""
        if self.backend == "sqlite":
            source = Path(self.url.removeprefix("sqlite:///"))
            target = self._workdir / f"clone-{uuid.uuid4().hex[:8]}.db"
            shutil.copyfile(source, target)
            return f"sqlite:///{target}", lambda: target.unlink(missing_ok=True)
        template = self.url.rsplit("/", 1)[1]
        name = f"deletion_bench_{uuid.uuid4().hex[:8]}"
        admin = create_engine(self._admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

        def drop() -> None:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()

        return self._admin_url.rsplit("/", 1)[0] + f"/{name}", drop

    def drop(self) -> None:
        """Remove the template."""
        self._drop()


def raw_delete_process(url: str) -> float:
    """Seconds of the raw ``DELETE``, run in a process of its own (``--raw-delete``)."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.deletion_bench", "--raw-delete", url],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(completed.stdout.strip().splitlines()[-1])["seconds"])


def remaining(url: str) -> tuple[int, int]:
    """Sessions left in the workspace and cleanup-outbox rows written (a side's check)."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as connection:
            sessions = connection.execute(
                select(func.count()).select_from(Session).where(Session.workspace_id == WS)
            ).scalar_one()
            outbox = connection.execute(
                select(func.count()).select_from(ResourceCleanupOutbox)
            ).scalar_one()
        return int(sessions), int(outbox)
    finally:
        engine.dispose()


async def grpc_purge(address: str) -> dict[str, Any]:
    """Purge everything over gRPC as maintenance does: 100 trees / 10,000 rows per call.

    One call with a cutoff before every tombstone first opens the channel and warms the
    host (a host that serves maintenance has been running); it removes nothing.
    """
    async with grpc.aio.insecure_channel(address) as channel:
        stub = host_pb2_grpc.HostServiceStub(channel)

        async def call(cutoff: int) -> host_pb2.PurgeDeletedSessionsResponse:
            return await stub.PurgeDeletedSessions(
                host_pb2.PurgeDeletedSessionsRequest(
                    cutoff_unix_ms=cutoff, max_trees=MAINTENANCE_TREES, max_rows=MAINTENANCE_ROWS
                ),
                metadata=metadata("admin"),
                timeout=300,
            )

        warm = await call(1)
        assert warm.purged_tree_count == 0, warm
        rows = trees = calls = 0
        started = time.perf_counter()
        while True:
            response = await call(10**12)
            calls += 1
            rows += response.purged_row_count
            trees += response.purged_tree_count
            if not response.more_remaining:
                break
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "rows": rows, "trees": trees, "calls": calls}


def bench_grpc_round(template: PurgeTemplate, workdir: Path, number: int) -> dict[str, Any]:
    """One round: the gRPC purge against a host process, and the raw ``DELETE`` process.

    Each side gets its own clone of the template; the order alternates between rounds.
    """
    seconds: dict[str, float] = {}
    calls = 0
    for side in ("ours", "raw") if number % 2 else ("raw", "ours"):
        url, drop = template.clone()
        try:
            if side == "raw":
                seconds[side] = raw_delete_process(url)
            else:
                host_dir = workdir / f"host-{uuid.uuid4().hex[:8]}"
                host_dir.mkdir()
                host = start_host(host_dir, url)
                try:
                    outcome = asyncio.run(grpc_purge(host.address))
                finally:
                    host.stop()
                assert outcome["rows"] == template.rows, (outcome, template.rows)
                assert outcome["trees"] == template.trees, outcome
                seconds[side], calls = outcome["seconds"], outcome["calls"]
            left, outbox = remaining(url)
            assert left == 0, (side, left)
            assert outbox == (template.trees * TREE_SIZE if side == "ours" else 0), outbox
        finally:
            drop()
    ours_rate, raw_rate = template.rows / seconds["ours"], template.rows / seconds["raw"]
    return {
        "round": number,
        "calls": calls,
        "purge_seconds": round(seconds["ours"], 3),
        "purge_rows_per_s": round(ours_rate),
        "raw_delete_seconds": round(seconds["raw"], 3),
        "raw_delete_rows_per_s": round(raw_rate),
        "ratio": round(ours_rate / raw_rate, 3),
    }


def bench_grpc_purge(
    backend: str, admin_url: str, workdir: Path, rounds: int, trees: int
) -> dict[str, Any]:
    """Interleaved gRPC purge / raw ``DELETE`` rounds on one backend, with medians."""
    template = PurgeTemplate(backend, admin_url, workdir, trees)
    try:
        results = []
        for number in range(1, rounds + 1):
            results.append(bench_grpc_round(template, workdir, number))
            latest = results[-1]
            print(
                f"[{backend}] gRPC purge round {number}: {latest['purge_seconds']} s "
                f"({latest['calls']} calls) vs raw DELETE process "
                f"{latest['raw_delete_seconds']} s, ratio {latest['ratio']}",
                flush=True,
            )
    finally:
        template.drop()
    return {
        "bounds": {"max_trees": MAINTENANCE_TREES, "max_rows": MAINTENANCE_ROWS},
        **summarize_purge(results, trees),
        "purge_rows_per_s_median": statistics.median(r["purge_rows_per_s"] for r in results),
        "raw_delete_rows_per_s_median": statistics.median(
            r["raw_delete_rows_per_s"] for r in results
        ),
    }


def seed_big_tree(url: str) -> str:
    """One live tree of 5,000 Sessions: root, 50 children, 99 grandchildren each."""
    root = "big"
    rows = [_session_row(root, None, root)]
    for child in range(50):
        cid = f"big-{child}"
        rows.append(_session_row(cid, root, root))
        grandchildren = 98 if child == 49 else 99  # exactly 5,000 Sessions
        rows.extend(_session_row(f"{cid}-{g}", cid, root) for g in range(grandchildren))
    _bulk(url, Session, rows)
    _analyze(url)
    return root


async def bench_delete_restore(url: str, rounds: int) -> dict[str, Any]:
    """Delete and restore one 5,000-Session tree ``rounds`` times through the domain calls.

    Args:
        url: The database to seed and measure.
        rounds: How many delete/restore pairs to time.

    Returns:
        The tree size and the latency summaries (ms) of the deletes and the restores.
    """
    root = seed_big_tree(url)
    database = Database(url)
    await database.start()
    deletes: list[float] = []
    restores: list[float] = []
    try:
        ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
        for _ in range(rounds):
            started = time.perf_counter()
            result = await delete.delete_sessions(ctx, WS, [root])
            deletes.append((time.perf_counter() - started) * 1000)
            assert len(result.deleted) == 5_000
            started = time.perf_counter()
            restored = await restore.restore_deleted_session(ctx, WS, root)
            restores.append((time.perf_counter() - started) * 1000)
            assert len(restored) == 5_000
    finally:
        await database.stop()
    return {
        "tree_size": 5_000,
        "delete": summarize("delete 5,000-Session tree", deletes),
        "restore": summarize("restore 5,000-Session tree", restores),
    }


def seed_listing(url: str) -> None:
    """``LISTING_TOMBSTONES`` single-Session tombstones for the listing benchmark.

    Args:
        url: The database to seed.
    """
    rows = [
        _session_row(
            f"l{i:06d}",
            None,
            f"l{i:06d}",
            updated_at_unix_ms=1_000 + i,
            deleted_at_unix_ms=5_000,
            deletion_generation=f"g{i}",
            component_size=1,
        )
        for i in range(LISTING_TOMBSTONES)
    ]
    _bulk(url, Session, rows)
    _analyze(url)


def query_plan(url: str) -> str:
    """The backend's plan of the first-page statement of ``ListDeletedSessions``."""
    engine = create_sync_engine_for(url)
    try:
        repository = DeletionRepository.__new__(DeletionRepository)
        statement: Any = repository.deleted_page_query(
            DeletedListingQuery(WS), after=None, limit=51
        )
        dialect = engine.dialect
        compiled = str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
        prefix = "EXPLAIN " if url.startswith("postgresql") else "EXPLAIN QUERY PLAN "
        with engine.connect() as connection:
            if url.startswith("postgresql"):
                connection.execute(text("ANALYZE sessions"))
            rows = connection.exec_driver_sql(prefix + compiled).all()
        return "\n".join(" ".join(str(col) for col in row) for row in rows)
    finally:
        engine.dispose()


async def bench_listing(url: str, rounds: int) -> dict[str, Any]:
    """The first page of ``ListDeletedSessions`` among many tombstones, ``rounds`` times.

    Args:
        url: The database to seed and measure.
        rounds: How many first-page listings to time.

    Returns:
        The tombstone count, the latency summary (ms), the query plan and whether it uses
        the deletion index.
    """
    seed_listing(url)
    plan = query_plan(url)
    database = Database(url)
    await database.start()
    latencies: dict[bool, list[float]] = {False: [], True: []}
    try:
        ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
        for _ in range(rounds):
            # total_count is counted only when asked (ADR 0024): time the page both ways.
            for counted in (False, True):
                started = time.perf_counter()
                page = await restore.list_deleted_sessions(
                    ctx,
                    WS,
                    title_filter=None,
                    section_key=None,
                    cursor="",
                    limit=50,
                    include_total_count=counted,
                )
                latencies[counted].append((time.perf_counter() - started) * 1000)
                assert len(page.items) == 50
                assert page.total_count == (LISTING_TOMBSTONES if counted else 0)
    finally:
        await database.stop()
    return {
        "tombstones": LISTING_TOMBSTONES,
        "first_page": summarize("ListDeletedSessions first page", latencies[False]),
        "first_page_with_total_count": summarize(
            "ListDeletedSessions first page with total_count", latencies[True]
        ),
        "query_plan": plan,
        "plan_uses_index": INDEX in plan,
    }


def fresh_database(backend: str, admin_url: str, workdir: Path) -> tuple[str, Callable[[], None]]:
    """A migrated database and its cleanup."""
    if backend == "sqlite":
        url = f"sqlite:///{workdir / f'bench-{uuid.uuid4().hex[:8]}.db'}"
        migrate.upgrade(url)
        return url, lambda: None
    name = f"deletion_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)

    def drop() -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return url, drop


def _plain(value: Any) -> Any:
    """Nested summaries as plain dicts, for the JSON result file."""
    if isinstance(value, Summary):
        return asdict(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _purge_rounds(backend: str, admin_url: str, workdir: Path, args: Any) -> dict[str, Any]:
    """The domain-call purge rounds on one backend, printed as they finish."""
    rounds = []
    for number in range(1, args.purge_rounds + 1):
        fresh = functools.partial(fresh_database, backend, admin_url, workdir)
        rounds.append(bench_purge_round(fresh, number, args.trees))
        latest = rounds[-1]
        print(
            f"[{backend}] purge round {number}: {latest['purge_seconds']} s vs raw "
            f"DELETE {latest['raw_delete_seconds']} s, ratio {latest['ratio']}",
            flush=True,
        )
    return summarize_purge(rounds, args.trees)


def _report(backend: str, section: dict[str, Any]) -> None:
    """Print one backend's medians."""
    for name, label in (("purge", "domain-call purge"), ("grpc_purge", "gRPC purge")):
        if name in section:
            result = section[name]
            print(
                f"[{backend}] {label} median over {len(result['rounds'])} rounds: "
                f"{result['purge_seconds_median']} s vs raw DELETE "
                f"{result['raw_delete_seconds_median']} s, median ratio "
                f"{result['ratio_median']} (target >= {TARGET_PURGE_RATIO})"
            )
    if "delete_restore" in section:
        for key in ("delete", "restore"):
            summary = section["delete_restore"][key]
            print(f"[{backend}] {summary.name}: p50 {summary.p50_ms:.1f} ms")
    if "listing" in section:
        listing = section["listing"]
        print(
            f"[{backend}] ListDeletedSessions first page over 100,000 tombstones: "
            f"p50 {listing['first_page'].p50_ms:.1f} ms "
            f"({listing['first_page_with_total_count'].p50_ms:.1f} ms with total_count), "
            "index used: "
            f"{listing['plan_uses_index']}"
        )


def main() -> None:
    """Run every measurement on every backend and write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--parts", default=",".join(PARTS), help="a subset of " + ",".join(PARTS))
    parser.add_argument(
        "--postgres-admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--purge-rounds", type=int, default=5, help="interleaved purge/raw DELETE rounds"
    )
    parser.add_argument(
        "--grpc-rounds", type=int, default=5, help="interleaved gRPC purge/raw DELETE rounds"
    )
    parser.add_argument(
        "--trees", type=int, default=PURGE_TREES, help="purge set size (trees of 105 rows)"
    )
    parser.add_argument("--raw-delete", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_delete:  # the baseline side of the gRPC part, in its own process
        print(json.dumps({"seconds": raw_delete(args.raw_delete)}))
        return
    parts = [part for part in args.parts.split(",") if part]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {sorted(unknown)}")
    backends = args.backends.split(",")
    admin_url = args.postgres_admin_url
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in backends:
            section: dict[str, Any] = {}
            if "purge" in parts:
                section["purge"] = _purge_rounds(backend, admin_url, workdir, args)
            if "grpc_purge" in parts:
                section["grpc_purge"] = bench_grpc_purge(
                    backend, admin_url, workdir, args.grpc_rounds, args.trees
                )
            for name in ("delete_restore", "listing"):
                if name not in parts:
                    continue
                url, drop = fresh_database(backend, admin_url, workdir)
                try:
                    if name == "delete_restore":
                        section[name] = asyncio.run(bench_delete_restore(url, args.rounds))
                    else:
                        section[name] = asyncio.run(bench_listing(url, args.rounds * 4))
                finally:
                    drop()
            results[backend] = section
            _report(backend, section)
    results = _plain(results)
    results["target_purge_ratio"] = TARGET_PURGE_RATIO
    results["purge_target_met"] = {
        part: all(results[b][part]["ratio_median"] >= TARGET_PURGE_RATIO for b in backends)
        for part in ("purge", "grpc_purge")
        if part in parts
    }
    path = write_results("deletion_bench", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
