"""Manual purge through maintenance vs. raw ``DELETE``, and the idle gate under load (MAINT-*).

Run: ``.venv/bin/python -m bench.maintenance_bench [--backends sqlite,postgres] [--rounds 5]
[--trials 50] [--postgres-url URL]`` (``--help`` lists the sizes; every option can also be
set as ``MAINTENANCE_BENCH_<OPTION>``, e.g. ``MAINTENANCE_BENCH_POSTGRES_URL``).

Every side is a real process with default settings: ``tutti serve host`` and ``tutti serve
maintenance`` (``TUTTI_HOST_ADDRESS``, a deployment-wide service token from the token file,
``TUTTI_MAINTENANCE_SCHEDULER_ENABLED=false`` so the schedule does not interfere; nothing else
changed), on a migrated SQLite file or a scratch Postgres database the benchmark creates and
drops. Sessions, settled Turns and Messages are bulk-inserted into the store; the roots are then
tombstoned through Host's ``DeleteSessions``, so every generation is real.

**(a) purge throughput.** A workspace of 100 single Sessions and 25 trees of 4 (root, two
children, one grandchild; spread evenly in scan order, so every batch has the same mix) —
200 Sessions with 10 Turns and 1,000 Messages each, 200,000
message rows — is seeded and tombstoned once into a template database. Each round clones the
template twice (SQLite: a file copy; Postgres: ``CREATE DATABASE ... TEMPLATE``), so both
sides start from identical rows:

* **purge**: ``RunManualPurge`` (``PURGE_SCOPE_WORKSPACE``) from this process: client →
  maintenance → Host ``PurgeWorkspaceTombstones`` batches of 10 components, the idle gate
  and a resource-cleanup pass between batches;
* **raw**: a separate process deletes the same rows with plain SQL ``DELETE`` statements
  (messages, interactions, Turns, then the Sessions leaf-first) in one transaction on the
  project's engine with default settings.

The rows each side removed are counted per table (before/after) and must be equal. Reported:
rows/s per round and the median of each side, and purge/raw (target: median ratio >= 0.5).

**(b) the idle gate under load.** One Host and one maintenance process; a bench-side runtime on
the runtime link acknowledges every command. A pause workspace of the same shape (200 messages
per Session) is topped up between trials so a purge always has many batches left. Trials
alternate with idle trials (the order alternating too). A purge trial starts ``RunManualPurge``,
waits a random delay (uniform over 0.1 s plus two batch durations), then ``SendInput``
(``new_turn``) creates a Turn on a fresh live Session of the client workspace. Measured: the
delay from the ``SendInput`` response to the ``RunManualPurge`` response
(``STOPPED_AGENT_ACTIVE``), and that ``SendInput``'s latency. An idle trial sends the same
``SendInput`` with no purge running. Each Turn is stopped with ``StopTurn`` and the next trial
waits until Host's ``GetActivityState`` shows no active Turn. The batch duration is measured on
idle calibration purges of the same shape (run time / batches). Targets: pause p99 within one
batch; ``SendInput`` p99 during purges <= 2x idle.

Results go to ``bench/results/maintenance_bench.json`` (``--output`` changes the name).
``--raw-delete URL WORKSPACE`` runs only the raw side (the benchmark starts itself that way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg
import yaml
from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from bench.host_bench import PROVIDER, TARGET_ID, TOKENS, BenchRuntime, ServerProcess
from bench.host_bench import WORKSPACE as CLIENT_WORKSPACE
from bench.stats import percentile, write_results
from grpcserver.auth import token_digest
from store.engine import create_sync_engine_for
from store.migrate import upgrade
from store.models import Message, Session, Turn

MAINTENANCE_TOKEN = "bench-maintenance-token"  # noqa: S105 - a throwaway token of the bench registry
"""The maintenance process's deployment-wide ``service`` token (``TUTTI_SERVICE_TOKEN``)."""
PURGE_WORKSPACE = "ws-purge"
PAUSE_WORKSPACE = "ws-pause"
TARGET_RATIO = 0.5
TARGET_PAUSE_BATCHES = 1.0
TARGET_SENDINPUT_P99_RATIO = 2.0
CANONICAL_TABLES = (
    "messages",
    "interactions",
    "interaction_response_operations",
    "host_operations",
    "runtime_command_outbox",
    "turns",
    "sessions",
)
"""Tables whose rows belong to a Session (cascade from ``sessions``), counted per side."""
PROMPT = "Summarize the open pull requests and list the failing checks for each one."
PAYLOAD = json.dumps({"text": "A representative assistant reply of a few sentences. " * 2})
RPC_TIMEOUT_S = 600.0


@dataclass
class Options:
    """Sizes and switches (``--name`` or ``MAINTENANCE_BENCH_<NAME>``)."""

    backends: str = "sqlite,postgres"
    postgres_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/"
    parts: str = "purge,pause"
    rounds: int = 5
    single_sessions: int = 100
    trees: int = 25
    tree_size: int = 4
    messages_per_session: int = 1000
    turns_per_session: int = 10
    trials: int = 50
    warmup_trials: int = 3
    pause_messages_per_session: int = 200
    pause_chunk_components: int = 200
    pause_reserve_components: int = 80
    calibration_components: int = 100
    calibration_runs: int = 3
    seed: int = 7
    output: str = "maintenance_bench"
    note: str = ""
    """Free text recorded with the options (e.g. which code the run measured)."""


def parse_options(argv: Sequence[str] | None = None) -> tuple[Options, list[str] | None]:
    """Options from the command line, defaults from ``MAINTENANCE_BENCH_<NAME>`` variables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.maintenance_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    for name, default in asdict(Options()).items():
        env = os.environ.get(f"MAINTENANCE_BENCH_{name.upper()}")
        kind = type(default)
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            default=kind(env) if env is not None else default,
            help=f"default {default!r} (env MAINTENANCE_BENCH_{name.upper()})",
        )
    parser.add_argument(
        "--raw-delete", nargs=2, metavar=("URL", "WORKSPACE"), help=argparse.SUPPRESS
    )
    args = vars(parser.parse_args(argv))
    raw = args.pop("raw_delete")
    options = Options(**args)
    if options.tree_size < 1 or options.turns_per_session < 1:
        parser.error("--tree-size and --turns-per-session must be at least 1")
    if options.messages_per_session < options.turns_per_session:
        parser.error("--messages-per-session must be at least --turns-per-session")
    return options, raw


# ------------------------------------------------------------------------ data


@dataclass(frozen=True)
class Shape:
    """What one seeded workspace holds: single Sessions and trees, Turns and Messages."""

    single_sessions: int
    trees: int
    tree_size: int
    messages_per_session: int
    turns_per_session: int

    @property
    def components(self) -> int:
        """Topmost tombstones after the roots are deleted."""
        return self.single_sessions + self.trees

    @property
    def sessions(self) -> int:
        """Sessions in the workspace."""
        return self.single_sessions + self.trees * self.tree_size

    def rows(self) -> dict[str, int]:
        """Rows per table."""
        return {
            "sessions": self.sessions,
            "turns": self.sessions * self.turns_per_session,
            "messages": self.sessions * self.messages_per_session,
        }


def tree_parents(prefix: str, shape: Shape) -> dict[str, str | None]:
    """Session id -> parent id, components spread evenly: every batch gets the same mix.

    Components are numbered in the purge's scan order (one ``DeleteSessions`` gives them one
    ``deleted_at``, so the scan orders them by id); the trees (root, children, and for a tree
    of 4 or more one grandchild) are spread among the single Sessions.
    """
    components = shape.components
    trees = (
        {components * tree // shape.trees for tree in range(shape.trees)} if shape.trees else set()
    )
    parents: dict[str, str | None] = {}
    for index in range(components):
        root = f"{prefix}{index:05d}"
        parents[root] = None
        if index not in trees:
            continue
        for member in range(1, shape.tree_size):
            if member == shape.tree_size - 1 and member >= 3:
                parents[f"{root}-{member}"] = f"{root}-1"  # a grandchild
            else:
                parents[f"{root}-{member}"] = root
    return parents


def seed(url: str, workspace: str, prefix: str, shape: Shape) -> list[str]:
    """Bulk-insert live Sessions with settled Turns and Messages; returns the roots."""
    parents = tree_parents(prefix, shape)
    roots: dict[str, str] = {}
    for sid in parents:
        node = sid
        while (parent := parents[node]) is not None:
            node = parent
        assert isinstance(node, str)
        roots[sid] = node
    per_turn = shape.messages_per_session // shape.turns_per_session
    now = time.time_ns() // 1_000_000
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as connection:
            session_rows = [
                {
                    "workspace_id": workspace,
                    "session_id": sid,
                    "parent_session_id": parent,
                    "root_session_id": roots[sid],
                    "agent_target_id": TARGET_ID,
                    "provider": PROVIDER,
                    "title": f"title {sid}",
                    "cwd": "/nonexistent/bench",
                    "rail_section_key": "conversations",
                    "message_version": shape.messages_per_session,
                    "next_message_sequence": shape.messages_per_session + 1,
                    "created_at_unix_ms": now,
                    "updated_at_unix_ms": now,
                }
                for sid, parent in parents.items()
            ]
            # Parents before children (the parent reference is checked per statement).
            depth = {sid: _depth(parents, sid) for sid in parents}
            session_rows.sort(key=lambda row: depth[str(row["session_id"])])
            connection.execute(insert(Session), session_rows)
            turns: list[dict[str, Any]] = []
            messages: list[dict[str, Any]] = []
            for sid in parents:
                for turn in range(shape.turns_per_session):
                    turns.append(
                        {
                            "workspace_id": workspace,
                            "session_id": sid,
                            "turn_id": f"turn-{turn}",
                            "phase": "settled",
                            "outcome": "completed",
                            "origin": "user",
                            "delivery": "new_turn",
                            "mode": "agent",
                            "created_at_unix_ms": now,
                            "updated_at_unix_ms": now,
                            "started_at_unix_ms": now,
                            "settled_at_unix_ms": now,
                        }
                    )
                for index in range(shape.messages_per_session):
                    turn = min(index // per_turn, shape.turns_per_session - 1)
                    first = index % per_turn == 0
                    messages.append(
                        {
                            "workspace_id": workspace,
                            "session_id": sid,
                            "message_id": f"m{index}",
                            "sequence": index + 1,
                            "version": index + 1,
                            "turn_id": f"turn-{turn}",
                            "occurred_at_unix_ms": now,
                            "created_at_unix_ms": now,
                            "updated_at_unix_ms": now,
                            "role": "user" if first else "assistant",
                            "kind": "text",
                            "payload_json": json.dumps({"text": PROMPT}) if first else PAYLOAD,
                        }
                    )
                if len(messages) >= 20_000:
                    connection.execute(insert(Turn), turns)
                    connection.execute(insert(Message), messages)
                    turns, messages = [], []
            if turns:
                connection.execute(insert(Turn), turns)
            if messages:
                connection.execute(insert(Message), messages)
        _analyze(engine, url)
    finally:
        engine.dispose()
    return [sid for sid, parent in parents.items() if parent is None]


def _depth(parents: dict[str, str | None], sid: str) -> int:
    depth = 0
    parent = parents[sid]
    while parent is not None:
        depth += 1
        parent = parents[parent]
    return depth


def _analyze(engine: Any, url: str) -> None:
    """Refresh planner statistics after a bulk load, as autovacuum would (Postgres only)."""
    if not url.startswith("postgresql"):
        return
    with engine.connect() as connection:
        for table in ("sessions", "turns", "messages"):
            connection.execute(text(f"ANALYZE {table}"))
        connection.commit()


def table_counts(url: str, workspace: str) -> dict[str, int]:
    """Rows of the workspace in every table that belongs to a Session."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as connection:
            return {
                table: int(
                    connection.execute(
                        text(f"SELECT count(*) FROM {table} WHERE workspace_id = :ws"),
                        {"ws": workspace},
                    ).scalar_one()
                )
                for table in CANONICAL_TABLES
            }
    finally:
        engine.dispose()


def topmost_tombstones(url: str, workspace: str) -> int:
    """Topmost tombstones left in the workspace (what a manual purge still has to do)."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as connection:
            return int(
                connection.execute(
                    text(
                        "SELECT count(*) FROM sessions WHERE workspace_id = :ws"
                        " AND deleted_at_unix_ms IS NOT NULL AND parent_session_id IS NULL"
                    ),
                    {"ws": workspace},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def raw_delete(url: str, workspace: str) -> dict[str, Any]:
    """The baseline: plain ``DELETE`` statements of every tombstone's rows, one transaction.

    Returns:
        Seconds (connect to commit) and the rows deleted per table.
    """
    tombstoned = (
        "SELECT session_id FROM sessions WHERE workspace_id = :ws"
        " AND deleted_at_unix_ms IS NOT NULL"
    )
    statements = [
        (
            "messages",
            f"DELETE FROM messages WHERE workspace_id = :ws AND session_id IN ({tombstoned})",
        ),
        (
            "interactions",
            f"DELETE FROM interactions WHERE workspace_id = :ws AND session_id IN ({tombstoned})",
        ),
        ("turns", f"DELETE FROM turns WHERE workspace_id = :ws AND session_id IN ({tombstoned})"),
        # Leaf-first: the parent reference is NO ACTION, checked at the end of each statement.
        (
            "sessions",
            "DELETE FROM sessions WHERE workspace_id = :ws AND deleted_at_unix_ms IS NOT NULL"
            " AND parent_session_id IS NOT NULL",
        ),
        (
            "sessions",
            "DELETE FROM sessions WHERE workspace_id = :ws AND deleted_at_unix_ms IS NOT NULL",
        ),
    ]
    engine = create_sync_engine_for(url)
    deleted: dict[str, int] = {}
    try:
        started = time.perf_counter()
        with engine.begin() as connection:
            for table, statement in statements:
                result = connection.execute(text(statement), {"ws": workspace})
                deleted[table] = deleted.get(table, 0) + int(result.rowcount)
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    return {"seconds": seconds, "deleted": deleted}


# ------------------------------------------------------------------------ databases


@dataclass
class Databases:
    """Creates, clones and drops the benchmark's databases on one backend."""

    backend: str
    postgres_url: str
    tmp: Path

    def _admin(self) -> str:
        url = make_url(self.postgres_url)
        return url.set(
            drivername="postgresql", database=url.database or "postgres"
        ).render_as_string(hide_password=False)

    def _url(self, name: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.tmp / f'{name}.db'}"
        url = make_url(self.postgres_url).set(drivername="postgresql+psycopg", database=name)
        return url.render_as_string(hide_password=False)

    def create(self, prefix: str) -> tuple[str, str]:
        """A fresh migrated database: (name, URL)."""
        name = f"maint_bench_{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        if self.backend == "postgres":
            with psycopg.connect(self._admin(), autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
        url = self._url(name)
        upgrade(url)
        return name, url

    def clone(self, template: str, prefix: str) -> tuple[str, str]:
        """An identical copy of ``template`` (no connection may be open to it)."""
        name = f"maint_bench_{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        if self.backend == "sqlite":
            source = self.tmp / f"{template}.db"
            engine = create_sync_engine_for(f"sqlite:///{source}")
            try:
                with engine.connect() as connection:
                    connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                engine.dispose()
            shutil.copyfile(source, self.tmp / f"{name}.db")
        else:
            with psycopg.connect(self._admin(), autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return name, self._url(name)

    def drop(self, name: str) -> None:
        """Remove the database."""
        if self.backend == "sqlite":
            for suffix in (".db", ".db-wal", ".db-shm"):
                (self.tmp / f"{name}{suffix}").unlink(missing_ok=True)
            return
        with psycopg.connect(self._admin(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def scratch(self, prefix: str, template: str | None = None) -> Iterator[str]:
        """A fresh (or cloned) database for the block, dropped after it."""
        name, url = self.clone(template, prefix) if template else self.create(prefix)
        try:
            yield url
        finally:
            self.drop(name)


# ------------------------------------------------------------------------ processes


def write_tokens(tmp: Path) -> Path:
    """The token file: host_bench's principals plus maintenance's service token."""
    workspaces = {"device": [CLIENT_WORKSPACE], "admin": ["*"], "service": ["*"]}
    entries = [
        {
            "subject": f"bench-{role}",
            "role": role,
            "workspaces": workspaces[role],
            "sha256": token_digest(token),
        }
        for role, token in TOKENS.items()
    ]
    entries.append(
        {
            "subject": "bench-maintenance",
            "role": "service",
            "workspaces": ["*"],
            "sha256": token_digest(MAINTENANCE_TOKEN),
        }
    )
    path = tmp / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return path


@dataclass
class Stack:
    """A Host process and a maintenance process on one database."""

    host: ServerProcess
    maintenance: ServerProcess

    @classmethod
    def start(cls, tmp: Path, url: str) -> Stack:
        """Start both, Host first (defaults, 127.0.0.1:0, scheduler off)."""
        tokens = write_tokens(tmp)
        common = dict(
            os.environ,
            TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
            TUTTI_DATABASE_URL=url,
            TUTTI_DATA_DIR=str(tmp),
            TUTTI_AUTH_TOKENS_FILE=str(tokens),
            TUTTI_DRAIN_DELAY_SECONDS="0",
            TUTTI_GRACE_PERIOD_SECONDS="5",
            TUTTI_LOG_FORMAT="text",
            TUTTI_RESOURCES_DIR=str(tmp / "resources"),
        )
        ports = {name: tmp / f"{name}-{uuid.uuid4().hex[:6]}.port" for name in ("host", "maint")}
        host = ServerProcess.start(
            [sys.executable, "-m", "tutti", "serve", "host", "--port-file", str(ports["host"])],
            ports["host"],
            common,
        )
        try:
            maintenance = ServerProcess.start(
                [
                    sys.executable,
                    "-m",
                    "tutti",
                    "serve",
                    "maintenance",
                    "--port-file",
                    str(ports["maint"]),
                ],
                ports["maint"],
                dict(
                    common,
                    TUTTI_HOST_ADDRESS=host.address,
                    TUTTI_SERVICE_TOKEN=MAINTENANCE_TOKEN,
                    TUTTI_MAINTENANCE_SCHEDULER_ENABLED="false",
                ),
            )
        except BaseException:
            host.stop()
            raise
        return cls(host, maintenance)

    def stop(self) -> None:
        """Maintenance first, then Host."""
        self.maintenance.stop()
        self.host.stop()


def admin() -> tuple[tuple[str, str], ...]:
    """Metadata of the operator (setup, purges, activity reads)."""
    return (("authorization", f"Bearer {TOKENS['admin']}"),)


def device() -> tuple[tuple[str, str], ...]:
    """Metadata of the client that starts Turns."""
    return (("authorization", f"Bearer {TOKENS['device']}"),)


async def tombstone(
    host: host_pb2_grpc.HostServiceAsyncStub, workspace: str, roots: list[str]
) -> None:
    """Delete the roots (and so their trees) through Host, 1,000 per call."""
    for start in range(0, len(roots), 1000):
        await host.DeleteSessions(
            host_pb2.DeleteSessionsRequest(
                workspace_id=workspace, session_ids=roots[start : start + 1000]
            ),
            metadata=admin(),
            timeout=RPC_TIMEOUT_S,
        )


async def manual_purge(
    stub: maintenance_pb2_grpc.MaintenanceServiceAsyncStub, workspace: str
) -> maintenance_pb2.RunManualPurgeResponse:
    """``RunManualPurge`` of every topmost tombstone of the workspace."""
    response: maintenance_pb2.RunManualPurgeResponse = await stub.RunManualPurge(
        maintenance_pb2.RunManualPurgeRequest(
            workspace_id=workspace, scope=maintenance_pb2.PURGE_SCOPE_WORKSPACE
        ),
        metadata=admin(),
        timeout=RPC_TIMEOUT_S,
    )
    return response


# ------------------------------------------------------------------------ (a) throughput


def _shape(options: Options, messages_per_session: int) -> Shape:
    return Shape(
        options.single_sessions,
        options.trees,
        options.tree_size,
        messages_per_session,
        options.turns_per_session,
    )


async def _tombstone_at(address: str, workspace: str, roots: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await tombstone(host_pb2_grpc.HostServiceStub(channel), workspace, roots)


async def _purge_at(stack: Stack, workspace: str) -> tuple[float, maintenance_pb2.MaintenanceRun]:
    async with grpc.aio.insecure_channel(stack.maintenance.address) as channel:
        stub = maintenance_pb2_grpc.MaintenanceServiceStub(channel)
        started = time.perf_counter()
        response = await manual_purge(stub, workspace)
        return time.perf_counter() - started, response.run


def purge_side(dbs: Databases, template: str, tmp: Path) -> dict[str, Any]:
    """One purge through maintenance on a fresh clone of the template."""
    with dbs.scratch("purge", template) as url:
        before = table_counts(url, PURGE_WORKSPACE)
        stack = Stack.start(tmp, url)
        try:
            host_cpu, maint_cpu = stack.host.cpu(), stack.maintenance.cpu()
            seconds, run = asyncio.run(_purge_at(stack, PURGE_WORKSPACE))
            host_cpu, maint_cpu = stack.host.cpu() - host_cpu, stack.maintenance.cpu() - maint_cpu
        finally:
            stack.stop()
        after = table_counts(url, PURGE_WORKSPACE)
    if run.state != maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED:
        raise RuntimeError(
            f"manual purge ended {maintenance_pb2.MaintenanceRunState.Name(run.state)}"
        )
    return {
        "seconds": seconds,
        "deleted": {table: before[table] - after[table] for table in CANONICAL_TABLES},
        "batches": run.progress.batches_completed,
        "components": run.progress.components_purged,
        "cleanup_completed": run.cleanup.completed,
        "host_cpu_s": round(host_cpu, 3),
        "maintenance_cpu_s": round(maint_cpu, 3),
    }


def raw_side(dbs: Databases, template: str) -> dict[str, Any]:
    """The raw ``DELETE`` in its own process on a fresh clone of the template."""
    with dbs.scratch("raw", template) as url:
        before = table_counts(url, PURGE_WORKSPACE)
        output = subprocess.run(
            [sys.executable, "-m", "bench.maintenance_bench", "--raw-delete", url, PURGE_WORKSPACE],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        after = table_counts(url, PURGE_WORKSPACE)
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    result["deleted"] = {table: before[table] - after[table] for table in CANONICAL_TABLES}
    return result


def bench_purge(options: Options, dbs: Databases, tmp: Path, label: str) -> dict[str, Any]:
    """Part (a): rounds of purge and raw ``DELETE`` on identical clones."""
    shape = _shape(options, options.messages_per_session)
    template, url = dbs.create("template")
    try:
        roots = seed(url, PURGE_WORKSPACE, "p", shape)
        stack = Stack.start(tmp, url)
        try:
            asyncio.run(_tombstone_at(stack.host.address, PURGE_WORKSPACE, roots))
        finally:
            stack.stop()
        if dbs.backend == "postgres":
            engine = create_sync_engine_for(url)
            try:
                _analyze(engine, url)
            finally:
                engine.dispose()
        rounds: list[dict[str, Any]] = []
        for number in range(1, options.rounds + 1):
            sides: dict[str, dict[str, Any]] = {}
            for side in ("purge", "raw") if number % 2 else ("raw", "purge"):
                sides[side] = (
                    purge_side(dbs, template, tmp) if side == "purge" else raw_side(dbs, template)
                )
            purge, raw = sides["purge"], sides["raw"]
            if purge["deleted"] != raw["deleted"]:
                raise RuntimeError(
                    f"sides removed different rows: {purge['deleted']} vs {raw['deleted']}"
                )
            rows = sum(purge["deleted"].values())
            record = {
                "round": number,
                "rows": rows,
                "deleted": purge["deleted"],
                "purge_seconds": round(purge["seconds"], 3),
                "purge_rows_per_s": round(rows / purge["seconds"]),
                "raw_seconds": round(raw["seconds"], 3),
                "raw_rows_per_s": round(rows / raw["seconds"]),
                "ratio": round(raw["seconds"] / purge["seconds"], 3),
                **{
                    key: purge[key]
                    for key in (
                        "batches",
                        "components",
                        "cleanup_completed",
                        "host_cpu_s",
                        "maintenance_cpu_s",
                    )
                },
            }
            rounds.append(record)
            print(
                f"[{label}] purge round {number}: {rows} rows, purge {record['purge_seconds']} s "
                f"({record['purge_rows_per_s']} rows/s, {record['batches']} batches, host CPU "
                f"{record['host_cpu_s']} s) vs raw {record['raw_seconds']} s "
                f"({record['raw_rows_per_s']} rows/s): ratio {record['ratio']}",
                flush=True,
            )
    finally:
        dbs.drop(template)
    ratio = statistics.median(r["ratio"] for r in rounds)
    return {
        "shape": asdict(shape) | {"components": shape.components, "sessions": shape.sessions},
        "rows": rounds[0]["rows"],
        "deleted_per_table": rounds[0]["deleted"],
        "rounds": rounds,
        "purge_rows_per_s_median": statistics.median(r["purge_rows_per_s"] for r in rounds),
        "raw_rows_per_s_median": statistics.median(r["raw_rows_per_s"] for r in rounds),
        "purge_seconds_median": statistics.median(r["purge_seconds"] for r in rounds),
        "raw_seconds_median": statistics.median(r["raw_seconds"] for r in rounds),
        "ratio_median": ratio,
        "target_ratio": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO,
    }


# ------------------------------------------------------------------------ (b) idle gate


class PauseRun:
    """Part (b) on one backend: calibration, then interleaved purge and idle trials."""

    def __init__(self, options: Options, url: str, stack: Stack, label: str) -> None:
        self.options = options
        self.url = url
        self.stack = stack
        self.label = label
        self.shape = _shape(options, options.pause_messages_per_session)
        self.rng = random.Random(options.seed)
        self.next_chunk = 0
        self.next_session = 0
        self.refused = 0
        self.drained = 0

    async def run(self) -> dict[str, Any]:
        """Everything of part (b); returns its result section."""
        async with (
            grpc.aio.insecure_channel(self.stack.host.address) as host_channel,
            grpc.aio.insecure_channel(self.stack.maintenance.address) as maint_channel,
        ):
            self.host = host_pb2_grpc.HostServiceStub(host_channel)
            self.maintenance = maintenance_pb2_grpc.MaintenanceServiceStub(maint_channel)
            runtime = BenchRuntime(host_channel)
            try:
                await self._setup(runtime)
                batch = await self._calibrate()
                result = await self._trials(batch)
            finally:
                await runtime.close()
        return result

    async def _setup(self, runtime: BenchRuntime) -> None:
        await self.host.RegisterAgentTarget(
            host_pb2.RegisterAgentTargetRequest(
                target=host_pb2.AgentTarget(
                    agent_target_id=TARGET_ID,
                    provider=PROVIDER,
                    display_name="Bench",
                    enabled=True,
                    launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref="bench:default"),
                    capabilities=canonical_pb2.RuntimeCapabilities(guidance=True, interrupt=True),
                )
            ),
            metadata=admin(),
        )
        await runtime.hello()
        count = 2 * (self.options.trials + self.options.warmup_trials) + 10
        for index in range(count):
            await self.host.CreateSession(
                host_pb2.CreateSessionRequest(
                    workspace_id=CLIENT_WORKSPACE,
                    agent_target_id=TARGET_ID,
                    session_id=f"live-{index}",
                    cwd="/nonexistent/bench",
                    title=f"live {index}",
                ),
                metadata=admin(),
            )

    async def _seed(self, workspace: str, components: int) -> None:
        """Seed ``components`` components of the pause shape into ``workspace``, tombstoned."""
        trees = round(components * self.shape.trees / max(1, self.shape.components))
        shape = Shape(
            components - trees,
            trees,
            self.shape.tree_size,
            self.shape.messages_per_session,
            self.shape.turns_per_session,
        )
        prefix = f"c{self.next_chunk}-"
        self.next_chunk += 1
        roots = await asyncio.to_thread(seed, self.url, workspace, prefix, shape)
        await tombstone(self.host, workspace, roots)

    async def _calibrate(self) -> dict[str, Any]:
        """Idle purges of ``calibration_components``: seconds per batch (run time / batches)."""
        per_batch: list[float] = []
        for run in range(self.options.calibration_runs):
            workspace = f"ws-calibration-{run}"
            await self._seed(workspace, self.options.calibration_components)
            started = time.perf_counter()
            response = await manual_purge(self.maintenance, workspace)
            seconds = time.perf_counter() - started
            if response.run.state != maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED:
                raise RuntimeError("calibration purge did not complete")
            per_batch.append(seconds * 1000 / response.run.progress.batches_completed)
        batch_ms = statistics.median(per_batch)
        print(
            f"[{self.label}] batch duration (idle calibration, "
            f"{self.options.calibration_components} components per run): "
            f"{', '.join(f'{ms:.0f}' for ms in per_batch)} ms -> median "
            f"{batch_ms:.0f} ms",
            flush=True,
        )
        return {"runs_ms": [round(ms, 1) for ms in per_batch], "median_ms": round(batch_ms, 1)}

    async def _gate_open(self) -> None:
        """Wait until Host reports no active Turn anywhere (the gate reopened)."""
        deadline = time.monotonic() + 30
        while True:
            state = await self.host.GetActivityState(
                host_pb2.GetActivityStateRequest(), metadata=admin()
            )
            if not state.any_turn_active:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("a Turn stayed active after StopTurn")
            await asyncio.sleep(0.02)

    async def _turn(self) -> tuple[float, float, host_pb2.SendInputResponse]:
        """``SendInput`` (new Turn on a fresh live Session): (sent, answered, response)."""
        session_id = f"live-{self.next_session}"
        self.next_session += 1
        sent = time.perf_counter()
        response: host_pb2.SendInputResponse = await self.host.SendInput(
            host_pb2.SendInputRequest(
                workspace_id=CLIENT_WORKSPACE,
                session_id=session_id,
                client_submit_id=f"submit-{uuid.uuid4().hex}",
                delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
                mode=canonical_pb2.COMPOSER_MODE_AGENT,
                content=PROMPT,
            ),
            metadata=device(),
            timeout=RPC_TIMEOUT_S,
        )
        return sent, time.perf_counter(), response

    async def _stop(self, response: host_pb2.SendInputResponse) -> None:
        await self.host.StopTurn(
            host_pb2.StopTurnRequest(
                workspace_id=CLIENT_WORKSPACE,
                session_id=response.session.session_id,
                turn_id=response.turn.turn_id,
            ),
            metadata=device(),
        )
        await self._gate_open()

    async def _top_up(self) -> None:
        remaining = await asyncio.to_thread(topmost_tombstones, self.url, PAUSE_WORKSPACE)
        if remaining < self.options.pause_reserve_components:
            await self._seed(PAUSE_WORKSPACE, self.options.pause_chunk_components)

    async def _idle_trial(self) -> float:
        sent, answered, response = await self._turn()
        await self._stop(response)
        return (answered - sent) * 1000

    async def _purge_trial(self, batch_ms: float) -> dict[str, float] | None:
        await self._top_up()
        started = time.perf_counter()
        purge = asyncio.create_task(manual_purge(self.maintenance, PAUSE_WORKSPACE))
        await asyncio.sleep(self.rng.uniform(0.1, 0.1 + 2 * batch_ms / 1000))
        if purge.done():  # refused or drained before the Turn: not a trial
            self.refused += 1
            with contextlib.suppress(grpc.aio.AioRpcError):
                await purge
            return None
        sent, answered, response = await self._turn()
        try:
            outcome = await purge
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # The Turn beat the worker's first gate check: refused, not a trial.
            self.refused += 1
            await self._stop(response)
            return None
        ended = time.perf_counter()
        await self._stop(response)
        if outcome.run.state == maintenance_pb2.MAINTENANCE_RUN_STATE_COMPLETED:
            self.drained += 1  # the workspace ran out before the gate closed: not a trial
            return None
        if outcome.run.state != maintenance_pb2.MAINTENANCE_RUN_STATE_STOPPED_AGENT_ACTIVE:
            state = maintenance_pb2.MaintenanceRunState.Name(outcome.run.state)
            raise RuntimeError(f"purge trial ended {state}, not STOPPED_AGENT_ACTIVE")
        return {
            "pause_ms": (ended - answered) * 1000,
            "send_input_ms": (answered - sent) * 1000,
            "turn_at_ms": (sent - started) * 1000,
            "run_ms": (ended - started) * 1000,
            "batches": outcome.run.progress.batches_completed,
        }

    async def _trials(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch_ms = float(batch["median_ms"])
        purge_trials: list[dict[str, float]] = []
        idle_ms: list[float] = []
        total = self.options.warmup_trials + self.options.trials
        number = 0
        while len(purge_trials) < total:
            order = ("idle", "purge") if number % 2 else ("purge", "idle")
            number += 1
            for kind in order:
                if kind == "idle":
                    idle_ms.append(await self._idle_trial())
                    continue
                trial = None
                while trial is None:
                    trial = await self._purge_trial(batch_ms)
                purge_trials.append(trial)
            if number % 10 == 0:
                print(f"[{self.label}] {len(purge_trials)} of {total} trials", flush=True)
        measured = purge_trials[self.options.warmup_trials :]
        idle = idle_ms[self.options.warmup_trials :]
        pauses = [t["pause_ms"] for t in measured]
        during = [t["send_input_ms"] for t in measured]
        pause_p50, pause_p99 = statistics.median(pauses), percentile(pauses, 0.99)
        during_p99, idle_p99 = percentile(during, 0.99), percentile(idle, 0.99)
        in_trial_batch = statistics.median(t["run_ms"] / max(1, t["batches"]) for t in measured)
        return {
            "shape": asdict(self.shape),
            "trials": len(measured),
            "warmup_trials": self.options.warmup_trials,
            "refused_or_early": self.refused,
            "drained_before_turn": self.drained,
            "batch_ms": batch,
            "batch_ms_in_trials_median": round(in_trial_batch, 1),
            "pause_ms": {
                "p50": round(pause_p50, 1),
                "p99": round(pause_p99, 1),
                "max": round(max(pauses), 1),
                "p99_in_batches": round(pause_p99 / batch_ms, 2),
                "target_p99_in_batches": TARGET_PAUSE_BATCHES,
                "met": pause_p99 <= TARGET_PAUSE_BATCHES * batch_ms,
            },
            "send_input_ms": {
                "purge_p50": round(statistics.median(during), 2),
                "purge_p99": round(during_p99, 2),
                "idle_p50": round(statistics.median(idle), 2),
                "idle_p99": round(idle_p99, 2),
                "p99_ratio": round(during_p99 / idle_p99, 2),
                "target_p99_ratio": TARGET_SENDINPUT_P99_RATIO,
                "met": during_p99 <= TARGET_SENDINPUT_P99_RATIO * idle_p99,
            },
            "batches_per_trial_median": statistics.median(t["batches"] for t in measured),
            "purge_trials": [{k: round(v, 2) for k, v in t.items()} for t in measured],
            "idle_send_input_ms": [round(ms, 2) for ms in idle],
        }


def bench_pause(options: Options, dbs: Databases, tmp: Path, label: str) -> dict[str, Any]:
    """Part (b) on a fresh database with its own Host and maintenance."""
    with dbs.scratch("pause") as url:
        stack = Stack.start(tmp, url)
        try:
            result = asyncio.run(PauseRun(options, url, stack, label).run())
        finally:
            stack.stop()
    pause, send = result["pause_ms"], result["send_input_ms"]
    print(
        f"[{label}] pause after Turn start: p50 {pause['p50']} ms, p99 {pause['p99']} ms "
        f"({pause['p99_in_batches']} batches of {result['batch_ms']['median_ms']} ms); "
        f"SendInput p99 during purge {send['purge_p99']} ms vs idle {send['idle_p99']} ms "
        f"({send['p99_ratio']}x)",
        flush=True,
    )
    return result


# ------------------------------------------------------------------------ report


def table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown tables of every backend's results."""
    lines = [
        "| backend | purge rows/s | raw rows/s | purge/raw | target >= 0.5 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for backend, section in results.items():
        if "purge" in section:
            p = section["purge"]
            lines.append(
                f"| {backend} | {p['purge_rows_per_s_median']:,.0f} "
                f"| {p['raw_rows_per_s_median']:,.0f} "
                f"| {p['ratio_median']:.2f} | {'met' if p['met'] else 'NOT met'} |"
            )
    lines += [
        "",
        "| backend | batch ms | pause p50 / p99 ms | p99 in batches | target <= 1 "
        "| SendInput p99 purge / idle ms | ratio | target <= 2x |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, section in results.items():
        if "pause" in section:
            b = section["pause"]
            pause, send = b["pause_ms"], b["send_input_ms"]
            lines.append(
                f"| {backend} | {b['batch_ms']['median_ms']:.0f} | {pause['p50']:.0f} / "
                f"{pause['p99']:.0f} | {pause['p99_in_batches']:.2f} "
                f"| {'met' if pause['met'] else 'NOT met'} | {send['purge_p99']:.1f} / "
                f"{send['idle_p99']:.1f} | {send['p99_ratio']:.2f} "
                f"| {'met' if send['met'] else 'NOT met'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Path | None:
    """Run the chosen parts on every backend and write the result file."""
    options, raw = parse_options(argv)
    if raw is not None:
        print(json.dumps(raw_delete(*raw)))
        return None
    backends = [name.strip() for name in options.backends.split(",") if name.strip()]
    parts = {name.strip() for name in options.parts.split(",") if name.strip()}
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        for backend in backends:
            dbs = Databases(backend, options.postgres_url, tmp)
            section: dict[str, Any] = {}
            if "purge" in parts:
                section["purge"] = bench_purge(options, dbs, tmp, backend)
            if "pause" in parts:
                section["pause"] = bench_pause(options, dbs, tmp, backend)
            results[backend] = section
    print(table(results))
    payload = {
        "options": asdict(options),
        "cpus": os.cpu_count(),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "backends": results,
        "targets_met": {
            backend: {
                name: part["met"]
                if name == "purge"
                else part["pause_ms"]["met"] and part["send_input_ms"]["met"]
                for name, part in section.items()
            }
            for backend, section in results.items()
        },
    }
    path = write_results(options.output, payload)
    print(f"wrote {path} in {payload['elapsed_s']} s")
    return path


if __name__ == "__main__":
    main()
