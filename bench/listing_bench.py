"""First-page cost of the listing RPCs vs. data size (issue #15: page cost independent of size).

Run: ``.venv/bin/python -m bench.listing_bench [--backends sqlite,postgres]
[--sizes 1000,20000,100000] [--calls 60] [--explain] [--sqlite-analyze]``

For each backend and each size this creates its own migrated database (a SQLite file; a
scratch Postgres database on 127.0.0.1:5432, dropped afterwards), seeds it directly with bulk
SQLAlchemy Core inserts (not RPCs: 100,000 ``CreateSession`` calls would take half an hour)
and starts a real host process on it (``python -m tutti serve host``, as ``bench.host_bench``
does). A seeded workspace of ``N`` root Sessions has 4 user projects plus the conversations
section, the roots spread evenly over the 5 sections; every live root has one settled Turn;
1 % of the live roots are pinned (at least two pages' worth, so every size returns the same
items); 5 % of the roots are deleted trees (a root tombstone and one child tombstone of the
same generation), so the deleted listing grows with ``N`` too.

It then measures, at concurrency 1 (one ``grpc.aio`` channel per host), the first page (50
items) of ``ListSessionSections`` (every section's first page plus the pinned page),
``ListSessionSectionPage`` (a project section) and ``ListDeletedSessions``, in interleaved
rounds: each round runs a chunk of every RPC against every size's host, so machine drift hits
every size alike. It prints, per backend, RPC and size, the median and p99 latency and the
host's CPU time per call (from ``/proc``), and the ratio of the largest size to the smallest
(target: at most 1.3 for both). ``--explain`` also prints the query plans of the listing
statements on the largest database (``EXPLAIN QUERY PLAN`` / ``EXPLAIN ANALYZE``). Postgres
databases are vacuumed and analyzed after seeding (as autovacuum would be); SQLite ones only with
``--sqlite-analyze`` (Host never runs ``ANALYZE``). The results, with the command line, go to
``bench/results/listing_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import Connection

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from bench.host_bench import (
    PROVIDER,
    TARGET_ID,
    WORKSPACE,
    ServerProcess,
    database,
    metadata,
    start_host,
)
from bench.stats import percentile, write_results
from store.models import CONVERSATIONS_SECTION_KEY, Session, Turn, UserProject

SIZES = (1_000, 20_000, 100_000)
PROJECTS = ("proj-alpha", "proj-bravo", "proj-charlie", "proj-delta")
SECTIONS = (*PROJECTS, CONVERSATIONS_SECTION_KEY)
PAGE_SIZE = 50
PINNED_EVERY = 100
DELETED_EVERY = 20
ROUNDS = 5
BATCH = 5_000
BASE_MS = 1_700_000_000_000
RPCS = ("ListSessionSections", "ListSessionSectionPage", "ListDeletedSessions")
TARGET_RATIO = 1.3


# ------------------------------------------------------------------------ seeding


def _session_row(index: int, **overrides: object) -> dict[str, object]:
    section = SECTIONS[index % len(SECTIONS)]
    row: dict[str, object] = {
        "workspace_id": WORKSPACE,
        "session_id": f"s-{index:06d}",
        "parent_session_id": None,
        "root_session_id": f"s-{index:06d}",
        "parent_turn_id": None,
        "agent_target_id": TARGET_ID,
        "provider": PROVIDER,
        "provider_target_ref": "bench:default",
        "title": f"bench session {index}",
        "cwd": "/nonexistent/bench",
        "rail_section_key": section,
        "rail_project_path": None if section == CONVERSATIONS_SECTION_KEY else f"/work/{section}",
        "settings_json": "{}",
        "capabilities_json": "{}",
        "launch_subagents_json": "[]",
        "message_version": 0,
        "next_message_sequence": 1,
        "pinned_at_unix_ms": None,
        "created_at_unix_ms": BASE_MS + index,
        # Distinct, increasing: the newest Sessions are the highest indexes.
        "updated_at_unix_ms": BASE_MS + index,
        "active_turn_id": None,
        "deleted_at_unix_ms": None,
        "deletion_generation": None,
        "component_size": None,
        "tombstone_legacy": False,
    }
    row.update(overrides)
    return row


def seed_rows(size: int) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """The rows of a workspace of ``size`` root Sessions, in insert batches (table, rows)."""
    # 1 % pinned, but at least enough for a full pinned page at every size, so that every
    # size's ListSessionSections returns the same number of items.
    pin_step = min(PINNED_EVERY, size // (2 * PAGE_SIZE))
    for start in range(0, size, BATCH):
        roots: list[dict[str, object]] = []
        children: list[dict[str, object]] = []
        turns: list[dict[str, object]] = []
        for index in range(start, min(size, start + BATCH)):
            if index % DELETED_EVERY == 1:
                deleted = {
                    "deleted_at_unix_ms": BASE_MS + size + index,
                    "deletion_generation": f"gen-{index}",
                    "component_size": 2,
                }
                roots.append(_session_row(index, **deleted))
                children.append(
                    _session_row(
                        index,
                        session_id=f"s-{index:06d}-child",
                        parent_session_id=f"s-{index:06d}",
                        title=f"bench child {index}",
                        **deleted,
                    )
                )
                continue
            pinned = BASE_MS + index if index % pin_step == 0 else None
            roots.append(_session_row(index, pinned_at_unix_ms=pinned))
            turns.append(
                {
                    "workspace_id": WORKSPACE,
                    "session_id": f"s-{index:06d}",
                    "turn_id": f"t-{index:06d}",
                    "client_submit_id": f"submit-{index}",
                    "phase": "settled",
                    "outcome": "completed",
                    "origin": "user",
                    "delivery": "new_turn",
                    "mode": "agent",
                    "version": 2,
                    "created_at_unix_ms": BASE_MS + index,
                    "updated_at_unix_ms": BASE_MS + index,
                    "settled_at_unix_ms": BASE_MS + index,
                }
            )
        yield "sessions", roots
        if children:
            yield "sessions", children
        yield "turns", turns


def seed(url: str, size: int, *, analyze: bool) -> float:
    """Bulk-insert the workspace (then ``ANALYZE``, on Postgres ``VACUUM ANALYZE``, when asked).

    Returns the seconds it took.
    """
    started = time.perf_counter()
    engine = create_engine(url)
    tables: dict[str, type[Session] | type[Turn]] = {"sessions": Session, "turns": Turn}
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(UserProject),
                [
                    {
                        "workspace_id": WORKSPACE,
                        "project_key": key,
                        "label": key.split("-", 1)[1].title(),
                        "path": f"/work/{key}",
                        "created_at_unix_ms": BASE_MS,
                        "updated_at_unix_ms": BASE_MS,
                    }
                    for key in PROJECTS
                ],
            )
            for table, rows in seed_rows(size):
                if rows:
                    connection.execute(insert(tables[table]), rows)
        if analyze:
            if engine.dialect.name == "postgresql":
                # What autovacuum does after a bulk load: statistics, and the dead versions the
                # one seeding transaction left in the maintained count rows (one per Session
                # inserted) cleared, as they are after ordinary one-Session transactions.
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as auto:
                    auto.execute(text("VACUUM ANALYZE"))
            else:
                with engine.connect() as connection:
                    connection.execute(text("ANALYZE"))
                    connection.commit()
    finally:
        engine.dispose()
    return time.perf_counter() - started


# ------------------------------------------------------------------------ query plans


def _plan(connection: Connection, sql: str) -> list[str]:
    if connection.dialect.name == "sqlite":
        rows = connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")).all()
        return [str(row[-1]) for row in rows]
    rows = connection.execute(text(f"EXPLAIN (ANALYZE, BUFFERS OFF) {sql}")).all()
    return [str(row[0]) for row in rows]


def explain(url: str) -> dict[str, list[str]]:
    """Query plans of the listing statements, as Host issues them, on one database.

    Host's pages are direct reads (``services.host.repository.listing_reads``, ADR 0039): one
    ``UNION ALL`` statement per page on Postgres, one statement per part on SQLite; each is
    shown with the first page's parameters bound.
    """
    from sqlalchemy import func, select

    from services.host.repository import listing_reads
    from services.host.repository.deletion import DeletedListingQuery
    from services.host.repository.sessions import RootSessionQuery, live_roots_clauses

    engine = create_engine(url)
    statements: dict[str, Any] = {}
    section = RootSessionQuery(WORKSPACE, section_key=PROJECTS[0], pinned=False)
    pinned = RootSessionQuery(WORKSPACE, pinned=True)
    reads = {
        "section": listing_reads.explainable_page(section, limit=PAGE_SIZE),
        "pinned": listing_reads.explainable_page(pinned, limit=PAGE_SIZE),
        "deleted": listing_reads.explainable_deleted(
            DeletedListingQuery(WORKSPACE), limit=PAGE_SIZE + 1
        ),
    }
    for name, query in (("section", section), ("pinned", pinned)):
        # The filtered count only a title query or an id set still runs (ADR 0024).
        statements[f"{name} full count"] = (
            select(func.count()).select_from(Session).where(*live_roots_clauses(query))
        )
    plans: dict[str, list[str]] = {}
    try:
        with engine.connect() as connection:
            for name, (union, parts) in reads.items():
                if connection.dialect.name == "sqlite":
                    for part, statement in parts.items():
                        statements[f"{name} {part}"] = statement
                else:
                    statements[f"{name} (one statement)"] = union
            for name, statement in statements.items():
                sql = str(
                    statement.compile(
                        dialect=connection.dialect, compile_kwargs={"literal_binds": True}
                    )
                )
                plans[name] = _plan(connection, sql)
    finally:
        engine.dispose()
    return plans


# ------------------------------------------------------------------------ measuring


@dataclass
class Series:
    """One RPC against one size's host, summed over the rounds."""

    latencies_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    items: int = 0

    def as_json(self) -> dict[str, Any]:
        """Median, p99 and CPU per call."""
        return {
            "calls": len(self.latencies_ms),
            "p50_ms": round(statistics.median(self.latencies_ms), 3),
            "p99_ms": round(percentile(self.latencies_ms, 0.99), 3),
            "host_cpu_ms_per_call": round(self.cpu_s * 1000 / len(self.latencies_ms), 3),
            "items_per_response": self.items,
        }


def rpc_calls(stub: host_pb2_grpc.HostServiceAsyncStub) -> dict[str, Callable[[], Awaitable[int]]]:
    """One first-page call per RPC; each returns the number of items it got back."""
    meta = metadata("device")

    async def sections() -> int:
        reply = await stub.ListSessionSections(
            host_pb2.ListSessionSectionsRequest(workspace_id=WORKSPACE, page_size=PAGE_SIZE),
            metadata=meta,
        )
        return sum(len(s.first_page.items) for s in reply.sections) + len(reply.pinned.items)

    async def section_page() -> int:
        reply = await stub.ListSessionSectionPage(
            host_pb2.ListSessionSectionPageRequest(
                workspace_id=WORKSPACE, section_key=PROJECTS[0], limit=PAGE_SIZE
            ),
            metadata=meta,
        )
        return len(reply.page.items)

    async def deleted() -> int:
        reply = await stub.ListDeletedSessions(
            host_pb2.ListDeletedSessionsRequest(workspace_id=WORKSPACE, limit=PAGE_SIZE),
            metadata=meta,
        )
        return len(reply.items)

    return {
        "ListSessionSections": sections,
        "ListSessionSectionPage": section_page,
        "ListDeletedSessions": deleted,
    }


async def measure(
    hosts: dict[int, ServerProcess], calls: int, warmup: int
) -> dict[str, dict[int, Series]]:
    """Interleaved rounds: each round, a chunk of every RPC against every size's host."""
    channels = {size: grpc.aio.insecure_channel(host.address) for size, host in hosts.items()}
    try:
        stubs = {
            size: rpc_calls(host_pb2_grpc.HostServiceStub(ch)) for size, ch in channels.items()
        }
        for size_calls in stubs.values():
            for call in size_calls.values():
                for _ in range(warmup):
                    await call()
        results = {rpc: {size: Series() for size in hosts} for rpc in RPCS}
        chunk = -(-calls // ROUNDS)
        for round_index in range(ROUNDS):
            count = min(chunk, calls - round_index * chunk)
            for rpc in RPCS:
                # Alternate the order of sizes between rounds, so neither end always goes first.
                order = list(hosts) if round_index % 2 == 0 else list(reversed(hosts))
                for size in order:
                    series = results[rpc][size]
                    before = hosts[size].cpu()
                    for _ in range(count):
                        started = time.perf_counter()
                        series.items = await stubs[size][rpc]()
                        series.latencies_ms.append((time.perf_counter() - started) * 1000)
                    series.cpu_s += hosts[size].cpu() - before
        return results
    finally:
        for channel in channels.values():
            await channel.close()


def report_backend(backend: str, results: dict[str, dict[int, Series]]) -> dict[str, Any]:
    """Print one backend's table and return its JSON."""
    sizes = sorted(next(iter(results.values())))
    smallest, largest = sizes[0], sizes[-1]
    out: dict[str, Any] = {}
    print(f"\n{backend}:")
    print("| RPC | Sessions | items | p50 / p99 ms | host CPU ms/call |")
    print("| --- | --- | --- | --- | --- |")
    for rpc, by_size in results.items():
        rows = {size: by_size[size].as_json() for size in sizes}
        for size in sizes:
            row = rows[size]
            print(
                f"| {rpc} | {size:,} | {row['items_per_response']} | "
                f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f} | {row['host_cpu_ms_per_call']:.2f} |"
            )
        latency_ratio = rows[largest]["p50_ms"] / rows[smallest]["p50_ms"]
        # Process CPU comes in clock ticks (10 ms): a short series can measure none at all.
        smallest_cpu = rows[smallest]["host_cpu_ms_per_call"]
        cpu_ratio = rows[largest]["host_cpu_ms_per_call"] / smallest_cpu if smallest_cpu else None
        met = latency_ratio <= TARGET_RATIO and (cpu_ratio is None or cpu_ratio <= TARGET_RATIO)
        cpu_text = "n/a (no CPU tick measured)" if cpu_ratio is None else f"{cpu_ratio:.2f}x"
        print(
            f"  {rpc} {largest:,}/{smallest:,}: p50 {latency_ratio:.2f}x, CPU {cpu_text} "
            f"(target <= {TARGET_RATIO}: {'met' if met else 'NOT met'})"
        )
        out[rpc] = {
            "by_size": {str(size): rows[size] for size in sizes},
            "p50_ratio_largest_to_smallest": round(latency_ratio, 3),
            "cpu_ratio_largest_to_smallest": None if cpu_ratio is None else round(cpu_ratio, 3),
            "target_met": met,
        }
    return out


def main() -> None:
    """Run the sweep and write ``bench/results/listing_bench.json``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--calls", type=int, default=60, help="measured calls per RPC and size")
    parser.add_argument("--warmup", type=int, default=5, help="calls per RPC and size first")
    parser.add_argument("--explain", action="store_true", help="print the largest size's plans")
    parser.add_argument(
        "--sqlite-analyze",
        action="store_true",
        help="also ANALYZE the SQLite databases (Host never does; Postgres is always analyzed, "
        "as autovacuum would do after a bulk load)",
    )
    parser.add_argument(
        "--output", default="listing_bench", help="result name under bench/results/"
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    report: dict[str, Any] = {
        "sizes": sizes,
        "calls_per_series": args.calls,
        "warmup_per_series": args.warmup,
        "rounds": ROUNDS,
        "page_size": PAGE_SIZE,
        "sections": len(SECTIONS),
        "pinned_fraction": f"1/{PINNED_EVERY}, at least {2 * PAGE_SIZE} pinned",
        "deleted_tree_fraction": 1 / DELETED_EVERY,
        "cpus": os.cpu_count(),
        "sqlite_analyzed": args.sqlite_analyze,
        "target_ratio": TARGET_RATIO,
        "backends": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        for backend in backends:
            with ExitStack() as stack:
                hosts: dict[int, ServerProcess] = {}
                urls: dict[int, str] = {}
                seeded: dict[str, float] = {}
                for size in sizes:
                    size_dir = tmp / f"{backend}-{size}"
                    size_dir.mkdir()
                    urls[size] = stack.enter_context(database(backend, size_dir))
                    seeded[str(size)] = round(
                        seed(
                            urls[size], size, analyze=backend == "postgres" or args.sqlite_analyze
                        ),
                        1,
                    )
                    host = start_host(size_dir, urls[size])
                    stack.callback(host.stop)
                    hosts[size] = host
                    print(f"[{backend}] {size:,} Sessions seeded in {seeded[str(size)]} s")
                results = asyncio.run(measure(hosts, args.calls, args.warmup))
                entry: dict[str, Any] = {"seed_s": seeded, "rpcs": report_backend(backend, results)}
                if args.explain:
                    entry["plans"] = explain(urls[sizes[-1]])
                    for name, plan in entry["plans"].items():
                        print(f"  plan [{backend}] {name}:")
                        for line in plan:
                            print(f"    {line}")
                report["backends"][backend] = entry
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    path = write_results(args.output, report)
    print(f"wrote {path} in {report['elapsed_s']} s")


if __name__ == "__main__":
    main()
