"""Delete, restore and purge at scale, on SQLite and Postgres in one run (HOST-DEL-*).

Run: ``.venv/bin/python -m bench.deletion_bench [--backends sqlite,postgres]
[--purge-rounds 5] [--rounds 5] [--postgres-admin-url URL]``.

For each backend, on fresh migrated databases:

* **purge** — 2,000 restorable tombstone trees (5 Sessions each) holding 200,000 message
  rows are removed by ``PurgeDeletedSessions`` (the domain call: read scans of 1,000
  candidates classified from component aggregates, then fenced write transactions of up to
  256 whole trees / 20,000 rows with their cleanup-outbox rows). The baseline is a raw
  ``DELETE FROM sessions WHERE ... deleted_at_unix_ms IS NOT NULL`` of the same rows (seeded
  again) in one transaction, with the same cascades. Each round runs both on a fresh
  database, alternating which goes first; reported per round and as medians: canonical rows
  per second and the ratio ours/raw (target: median ratio >= 0.5).
* **delete + restore** — one 5,000-Session tree (root, 50 children, 99 grandchildren each)
  deleted with ``DeleteSessions`` and restored with ``RestoreDeletedSession``: latency.
* **listing** — ``ListDeletedSessions`` first page (50 items, with ``total_count``) over
  100,000 topmost tombstones: latency, and the query plan of the page statement, which must
  name the ``ix_sessions_tombstone_listing`` index.

Results go to ``bench/results/deletion_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text
from sqlalchemy.pool import NullPool

from bench.stats import Summary, summarize, write_results
from services.host.context import HostContext
from services.host.deletion import delete, purge, restore
from services.host.repository.deletion import DeletedListingQuery, DeletionRepository
from services.host.wire.command_codec import ProtoCommandCodec
from store import migrate
from store.database import Database
from store.engine import create_sync_engine_for
from store.models import Message, Session

WS = "bench"
PURGE_TREES = 2_000
TREE_SIZE = 5
MESSAGES_PER_SESSION = 20  # 2,000 trees x 5 Sessions x 20 = 200,000 message rows
LISTING_TOMBSTONES = 100_000
INDEX = "ix_sessions_tombstone_listing"
TARGET_PURGE_RATIO = 0.5


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


def seed_purge_trees(url: str) -> int:
    """2,000 restorable tombstone trees with 200,000 messages; returns canonical rows."""
    sessions: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for tree in range(PURGE_TREES):
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


async def purge_seconds(url: str, rows: int) -> float:
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
            purge.PurgeBounds(max_trees=PURGE_TREES, max_rows=10**9, max_bytes=10**12),
        )
        ours = time.perf_counter() - started
    finally:
        await database.stop()
    assert report.purged_tree_count == PURGE_TREES, report.purged_tree_count
    assert report.purged_row_count == rows, (report.purged_row_count, rows)
    return ours


def bench_purge_round(
    fresh: Callable[[], tuple[str, Callable[[], None]]], number: int
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
            rows = seed_purge_trees(url)
            seconds[side] = (
                asyncio.run(purge_seconds(url, rows)) if side == "ours" else raw_delete(url)
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


def summarize_purge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds with their medians; the verdict is on the median ratio."""
    return {
        "trees": PURGE_TREES,
        "rows": PURGE_TREES * TREE_SIZE * (MESSAGES_PER_SESSION + 1),
        "rounds": rounds,
        "purge_seconds_median": statistics.median(r["purge_seconds"] for r in rounds),
        "raw_delete_seconds_median": statistics.median(r["raw_delete_seconds"] for r in rounds),
        "ratio_median": statistics.median(r["ratio"] for r in rounds),
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
    latencies: list[float] = []
    try:
        ctx = HostContext(database=database, command_codec=ProtoCommandCodec())
        for _ in range(rounds):
            started = time.perf_counter()
            page = await restore.list_deleted_sessions(
                ctx, WS, title_filter=None, section_key=None, cursor="", limit=50
            )
            latencies.append((time.perf_counter() - started) * 1000)
        assert len(page.items) == 50
        assert page.total_count == LISTING_TOMBSTONES
    finally:
        await database.stop()
    return {
        "tombstones": LISTING_TOMBSTONES,
        "first_page": summarize("ListDeletedSessions first page", latencies),
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


def main() -> None:
    """Run every measurement on every backend and write the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--postgres-admin-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--purge-rounds", type=int, default=5, help="interleaved purge/raw DELETE rounds"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            section: dict[str, Any] = {}
            purge_rounds = []
            for number in range(1, args.purge_rounds + 1):
                fresh = functools.partial(
                    fresh_database, backend, args.postgres_admin_url, Path(tmp)
                )
                purge_rounds.append(bench_purge_round(fresh, number))
                latest = purge_rounds[-1]
                print(
                    f"[{backend}] purge round {number}: {latest['purge_seconds']} s vs raw "
                    f"DELETE {latest['raw_delete_seconds']} s, ratio {latest['ratio']}",
                    flush=True,
                )
            section["purge"] = summarize_purge(purge_rounds)
            for name in ("delete_restore", "listing"):
                url, drop = fresh_database(backend, args.postgres_admin_url, Path(tmp))
                try:
                    if name == "delete_restore":
                        section[name] = asyncio.run(bench_delete_restore(url, args.rounds))
                    else:
                        section[name] = asyncio.run(bench_listing(url, args.rounds * 4))
                finally:
                    drop()
            results[backend] = section
            purge_result = section["purge"]
            print(
                f"[{backend}] purge median over {len(purge_rounds)} rounds: "
                f"{purge_result['purge_seconds_median']} s vs raw DELETE "
                f"{purge_result['raw_delete_seconds_median']} s, median ratio "
                f"{purge_result['ratio_median']} (target >= {TARGET_PURGE_RATIO})"
            )
            for key in ("delete", "restore"):
                summary = section["delete_restore"][key]
                print(f"[{backend}] {summary.name}: p50 {summary.p50_ms:.1f} ms")
            listing = section["listing"]
            print(
                f"[{backend}] ListDeletedSessions first page over 100,000 tombstones: "
                f"p50 {listing['first_page'].p50_ms:.1f} ms, index used: "
                f"{listing['plan_uses_index']}"
            )
    results = _plain(results)
    results["target_purge_ratio"] = TARGET_PURGE_RATIO
    results["purge_target_met"] = all(
        results[b]["purge"]["ratio_median"] >= TARGET_PURGE_RATIO for b in args.backends.split(",")
    )
    path = write_results("deletion_bench", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
