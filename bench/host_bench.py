"""Host RPC throughput vs. the transport limit (bare gRPC echo) and the storage limit (raw SQL).

Run: ``.venv/bin/python -m bench.host_bench [--backends sqlite,postgres] [--requests N]``

For each backend (SQLite in a temporary file; Postgres in a scratch database created on
127.0.0.1:5432 and dropped afterwards, both migrated with ``store.migrate.upgrade``) this
starts a real host process (``python -m tutti serve host`` with a tokens file) and measures,
at concurrency 1 and 32 (one ``grpc.aio`` channel, that many tasks issuing calls back to
back):

* ``GetSession`` of a Session with an active Turn and 150 messages;
* ``SendInput`` ``new_turn`` on an idle Session (one fresh Session per call; a bench-side
  runtime holds the link open and acknowledges every command, as a real one does);
* ``SendInput`` replaying an existing ``client_submit_id`` (identical content);
* ``ListSessionMessages``, ascending page of 100 on that 150-message Session;

each beside two baselines measured right after it, with the same request count and
concurrency:

* ``echo``: a bare ``grpc.aio`` unary echo server in its own process (no interceptor, no
  protobuf decoding), sent the same call metadata and request bytes and answering with as
  many bytes as the host's response -- the transport limit;
* ``storage``: the same rows written or read in one raw SQLAlchemy Core transaction, in the
  same database, by a storage worker in its own process (``--storage-worker URL``, driven
  over its stdin with the same call count and concurrency) -- the storage limit. For
  ``SendInput`` that is the Turn insert, the user message insert and the Session update;
  for the reads, the same
  rows the host reads (Session, active and latest Turn, pending Interactions and the tree
  for ``GetSession``; message, Turn and Session for a replay; Session and 101 messages for
  a page).

It prints throughput and p50/p99 of every series, the throughput and latency ratios to
each baseline, the CPU time the server process spent per request, and writes
``bench/results/host_bench.json``. Targets (SQLite, concurrency 32): ``GetSession`` at
least 0.5 x echo throughput, ``SendInput`` at least 0.35 x echo throughput.

``--serve-echo PORT_FILE`` runs only the echo server (the benchmark starts itself that way).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import yaml
from sqlalchemy import and_, insert, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2, runtime_pb2_grpc
from bench.stats import Summary, ratio_line, summarize, write_results
from grpcserver.auth import token_digest
from services.host.runtime.registry import PROTOCOL_REVISION
from store.engine import SQLITE_BEGIN_OPTION, create_async_engine_for
from store.migrate import upgrade
from store.models import Interaction, Message, Session, Turn

WORKSPACE = "ws-bench"
TARGET_ID = "bench-target"
PROVIDER = "bench"
LIST_SESSION = "bench-list"
LIST_MESSAGES = 150
PAGE = 100
CONCURRENCIES = (1, 32)
SETUP_CONCURRENCY = 8
ROUNDS = 3
PROMPT = "Summarize the open pull requests and list the failing checks for each one."
ASSISTANT_TEXT = "A representative assistant reply of a few sentences. " * 6
TOKENS = {
    "device": "bench-device-token",  # the caller of the measured RPCs, scoped to WORKSPACE
    "admin": "bench-admin-token",  # setup calls
    "service": "bench-runtime-token",  # the runtime link
}
ROLE_WORKSPACES = {"device": [WORKSPACE], "admin": ["*"], "service": ["*"]}
POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
RPCS = ("GetSession", "SendInput new", "SendInput replay", "ListSessionMessages")
# Issue #15's targets, throughput x echo at concurrency 32 on both backends.
TARGETS = {"GetSession": 0.25, "SendInput new": 0.15, "SendInput replay": 0.3}
ECHO_METHOD = "/bench.Echo/Echo"


def metadata(principal: str) -> tuple[tuple[str, str], ...]:
    """Call metadata authenticating as one of the benchmark's principals."""
    return (("authorization", f"Bearer {TOKENS[principal]}"),)


# ------------------------------------------------------------------------ processes


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """Busy CPU time of the whole machine so far, all cores (``/proc/stat``, no idle/iowait).

    Every process of a series — client, server, database — runs on the same cores, so on a
    saturated machine throughput is about the cores over this per call.
    """
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds() -> float:
    """CPU time of every process named ``postgres`` so far (the server and its backends)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        name, _, rest = text.partition(" (")[2].rpartition(")")
        if name == "postgres":
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class ServerProcess:
    """A server subprocess that wrote its port to a file once it was serving."""

    process: subprocess.Popen[bytes]
    address: str

    @classmethod
    def start(cls, argv: list[str], port_file: Path, env: dict[str, str]) -> ServerProcess:
        """Start ``argv`` and wait (30 s at most) until ``port_file`` names the port."""
        process = subprocess.Popen(argv, env=env)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None:
                raise RuntimeError(f"{argv} exited with {process.returncode} during start")
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{argv} did not start")
            time.sleep(0.05)
        return cls(process, f"127.0.0.1:{port_file.read_text().strip()}")

    def cpu(self) -> float:
        """CPU seconds the process used so far."""
        return cpu_seconds(self.process.pid)

    def stop(self) -> None:
        """SIGTERM (graceful drain), then kill after 15 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def echo_server() -> tuple[grpc.aio.Server, int]:
    """Start the transport baseline on 127.0.0.1: a bare server, no interceptor, raw bytes.

    The first four bytes of a request are the response size (big-endian); the rest is
    padding so the request has the size of the host request it stands for.

    Returns:
        The started server and its port.
    """
    replies: dict[int, bytes] = {}

    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        (size,) = struct.unpack_from(">I", request)
        reply = replies.get(size)
        if reply is None:
            reply = replies[size] = b"x" * size
        return reply

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def serve_echo(port_file: Path) -> None:
    """Run the echo server until SIGTERM, announcing its port in ``port_file``."""
    server, port = await echo_server()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await asyncio.to_thread(port_file.write_text, f"{port}\n")
    await stop.wait()
    await server.stop(0)


def start_echo(tmp: Path) -> ServerProcess:
    """Start the echo server as a separate process."""
    port_file = tmp / "echo.port"
    return ServerProcess.start(
        [sys.executable, "-m", "bench.host_bench", "--serve-echo", str(port_file)],
        port_file,
        dict(os.environ),
    )


def start_host(tmp: Path, url: str, extra_env: dict[str, str] | None = None) -> ServerProcess:
    """Start ``tutti serve host`` on 127.0.0.1 with the benchmark's tokens (and ``extra_env``)."""
    tokens = tmp / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {
                        "subject": f"bench-{role}",
                        "role": role,
                        "workspaces": ROLE_WORKSPACES[role],
                        "sha256": token_digest(token),
                    }
                    for role, token in TOKENS.items()
                ]
            }
        )
    )
    port_file = tmp / "host.port"
    port_file.unlink(missing_ok=True)
    env = dict(
        os.environ,
        TUTTI_LISTEN_ADDRESS="127.0.0.1:0",
        TUTTI_DATABASE_URL=url,
        TUTTI_DATA_DIR=str(tmp),
        TUTTI_AUTH_TOKENS_FILE=str(tokens),
        TUTTI_DRAIN_DELAY_SECONDS="0",
        TUTTI_GRACE_PERIOD_SECONDS="5",
        TUTTI_LOG_FORMAT="text",
        **(extra_env or {}),
    )
    return ServerProcess.start(
        [sys.executable, "-m", "tutti", "serve", "host", "--port-file", str(port_file)],
        port_file,
        env,
    )


@contextlib.contextmanager
def database(backend: str, tmp: Path) -> Iterator[str]:
    """A migrated database URL: a SQLite file, or a scratch Postgres database (dropped after)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp / 'host-bench.db'}"
        upgrade(url)
        yield url
        return
    name = f"host_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ------------------------------------------------------------------------ the runtime


class BenchRuntime:
    """A minimal runtime on the link: hello, acknowledge every command, send reports."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._outbox: asyncio.Queue[runtime_pb2.RuntimeLinkRequest | None] = asyncio.Queue()
        self._results: dict[str, asyncio.Future[runtime_pb2.ReportResult]] = {}
        self._welcome: asyncio.Future[runtime_pb2.RuntimeWelcome] = (
            asyncio.get_running_loop().create_future()
        )
        stub = runtime_pb2_grpc.RuntimeLinkServiceStub(channel)
        self._call = stub.RuntimeLink(self._frames(), metadata=metadata("service"))
        self.commands = 0
        self._reader = asyncio.create_task(self._read())

    async def _frames(self) -> AsyncIterator[runtime_pb2.RuntimeLinkRequest]:
        while (frame := await self._outbox.get()) is not None:
            yield frame

    async def _read(self) -> None:
        async for frame in self._call:
            kind = frame.WhichOneof("frame")
            if kind == "welcome":
                self._welcome.set_result(frame.welcome)
            elif kind == "command":
                self.commands += 1
                ack = runtime_pb2.CommandAck(
                    command_id=frame.command.command_id,
                    status=runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED,
                )
                self._outbox.put_nowait(runtime_pb2.RuntimeLinkRequest(command_ack=ack))
            elif kind == "report_result":
                self._results.pop(frame.report_result.report_id).set_result(frame.report_result)

    async def hello(self) -> None:
        """Open the link for the benchmark's provider."""
        self._outbox.put_nowait(
            runtime_pb2.RuntimeLinkRequest(
                hello=runtime_pb2.RuntimeHello(
                    runtime_id="bench-runtime",
                    runtime_instance_id=f"bench-{uuid.uuid4()}",
                    protocol_revision=PROTOCOL_REVISION,
                    providers=[PROVIDER],
                    capabilities=canonical_pb2.RuntimeCapabilities(
                        guidance=True, interrupt=True, live_settings=True
                    ),
                )
            )
        )
        await asyncio.wait_for(self._welcome, timeout=10)

    async def report(
        self, session_id: str, items: list[runtime_pb2.ReportItem]
    ) -> runtime_pb2.ReportResult:
        """Send one report and wait for Host's verdict."""
        report_id = f"report-{uuid.uuid4()}"
        future = self._results[report_id] = asyncio.get_running_loop().create_future()
        self._outbox.put_nowait(
            runtime_pb2.RuntimeLinkRequest(
                report=runtime_pb2.RuntimeReport(
                    report_id=report_id, workspace_id=WORKSPACE, session_id=session_id, items=items
                )
            )
        )
        return await asyncio.wait_for(future, timeout=30)

    async def close(self) -> None:
        """Half-close the stream and wait for Host to end it."""
        self._outbox.put_nowait(None)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await asyncio.wait_for(self._reader, timeout=10)


# ------------------------------------------------------------------------ measuring


@dataclass
class Series:
    """Raw measurements of one series."""

    latencies_ms: list[float]
    elapsed_s: float
    errors: dict[str, int] = field(default_factory=dict)
    """Failed calls by status code (or exception type); they count in no latency."""
    server_cpu_s: float | None = None
    machine_cpu_s: float = 0.0
    """Busy CPU of the whole machine over the series (:func:`machine_cpu_seconds`)."""
    database_cpu_s: float = 0.0
    """CPU of the Postgres server's processes over the series (0 on SQLite)."""

    def summary(self, name: str) -> Summary:
        """The shared summary of this series."""
        return summarize(name, self.latencies_ms, self.elapsed_s)


async def drive(
    call: Callable[[int], Awaitable[object]], count: int, concurrency: int, first: int = 0
) -> Series:
    """Issue calls ``first .. first+count-1`` from ``concurrency`` tasks, each back to back."""
    indexes = iter(range(first, first + count))
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()

    async def worker() -> None:
        # One shared iterator: a task takes the next index when its previous call returned.
        for index in indexes:
            started = time.perf_counter()
            try:
                await call(index)
            except grpc.aio.AioRpcError as error:
                # A failed call is a result too (e.g. SQLite's "database is locked" surfacing
                # as INTERNAL under write contention): count it, keep measuring.
                errors[error.code().name] += 1
                continue
            except DBAPIError as error:
                errors[type(error.orig).__name__] += 1
                continue
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Series(latencies, time.perf_counter() - started, dict(errors))


class StorageWorker:
    """The storage baseline in its own process, like the host: ``--storage-worker URL``.

    Each chunk of calls is one JSON line on the worker's stdin (the kind of call, its first
    index, count and concurrency, and the replay targets); the worker runs the chunk with
    :func:`drive` on its own event loop and answers one JSON line with the latencies.
    """

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.host_bench", "--storage-worker", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.submitted: list[str] = []

    def cpu(self) -> float:
        """CPU seconds the worker used so far."""
        return cpu_seconds(self.process.pid)

    def calls(self, kind: str) -> RemoteCalls:
        """The calls of one kind (``get_session``, ``submit``, ``replay``, ``page``)."""
        return RemoteCalls(self, kind)

    async def run(self, kind: str, first: int, count: int, concurrency: int) -> Series:
        """Run one chunk in the worker; its latencies come back as a :class:`Series`."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        line = json.dumps(
            {
                "kind": kind,
                "first": first,
                "count": count,
                "concurrency": concurrency,
                "submitted": self.submitted if kind == "replay" else [],
            }
        )
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = await asyncio.to_thread(self.process.stdout.readline)
        if not answer:
            raise RuntimeError(f"the storage worker exited ({self.process.poll()})")
        outcome = json.loads(answer)
        return Series(outcome["latencies_ms"], outcome["elapsed_s"], outcome["errors"])

    def stop(self) -> None:
        """Close its stdin (it exits) and wait."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class RemoteCalls:
    """Calls of one kind that run in the storage worker's process."""

    worker: StorageWorker
    kind: str


def _storage_call(
    storage: StorageBaseline, kind: str, concurrency: int, submitted: list[str]
) -> Callable[[int], Awaitable[object]]:
    """The storage baseline's call of one kind, by call index."""
    calls: dict[str, Callable[[int], Awaitable[object]]] = {
        "get_session": lambda index: storage.get_session(LIST_SESSION),
        "submit": lambda index: storage.submit(f"raw-c{concurrency}-{index}"),
        "replay": lambda index: storage.replay(submitted[index % len(submitted)]),
        "page": lambda index: storage.page(LIST_SESSION),
    }
    return calls[kind]


async def serve_storage(url: str) -> None:
    """The storage worker: run the chunks read from stdin, answer each on stdout."""
    engine = create_async_engine_for(url)
    storage = StorageBaseline(engine)
    try:
        while line := await asyncio.to_thread(sys.stdin.readline):
            chunk = json.loads(line)
            series = await drive(
                _storage_call(storage, chunk["kind"], chunk["concurrency"], chunk["submitted"]),
                chunk["count"],
                chunk["concurrency"],
                first=chunk["first"],
            )
            print(
                json.dumps(
                    {
                        "latencies_ms": series.latencies_ms,
                        "elapsed_s": series.elapsed_s,
                        "errors": series.errors,
                    }
                ),
                flush=True,
            )
    finally:
        await engine.dispose()


Contender = Callable[[int], Awaitable[object]] | RemoteCalls


async def _drive_contender(call: Contender, count: int, concurrency: int, first: int = 0) -> Series:
    if isinstance(call, RemoteCalls):
        return await call.worker.run(call.kind, first, count, concurrency)
    return await drive(call, count, concurrency, first=first)


async def interleaved(
    contenders: Sequence[tuple[Contender, ServerProcess | StorageWorker | None]],
    count: int,
    warmup: int,
    concurrency: int,
    *,
    postgres: bool = False,
) -> list[Series]:
    """Measure ``count`` calls of each contender, alternating in ``ROUNDS`` chunks.

    Each contender is warmed up with ``warmup`` calls (indexes ``0 .. warmup-1``) first.
    Alternating chunks spreads the drift of a shared machine over all contenders alike;
    throughput is the calls over the summed time of a contender's chunks.
    """
    for call, _ in contenders:
        await _drive_contender(call, warmup, concurrency)
    merged = [Series([], 0.0, {}, 0.0 if server else None) for _, server in contenders]
    chunk = -(-count // ROUNDS)
    for round_index in range(ROUNDS):
        first = warmup + round_index * chunk
        size = min(chunk, count - round_index * chunk)
        for (call, server), total in zip(contenders, merged, strict=True):
            before = server.cpu() if server is not None else 0.0
            machine_before = machine_cpu_seconds()
            database_before = postgres_cpu_seconds() if postgres else 0.0
            series = await _drive_contender(call, size, concurrency, first=first)
            total.machine_cpu_s += machine_cpu_seconds() - machine_before
            if postgres:
                total.database_cpu_s += postgres_cpu_seconds() - database_before
            total.latencies_ms += series.latencies_ms
            total.elapsed_s += series.elapsed_s
            for code, failed in series.errors.items():
                total.errors[code] = total.errors.get(code, 0) + failed
            if server is not None and total.server_cpu_s is not None:
                total.server_cpu_s += server.cpu() - before
    return merged


def echo_call(
    channel: grpc.aio.Channel, request_size: int, response_size: int
) -> Callable[[int], Awaitable[object]]:
    """A call of the echo server with the host call's request and response sizes."""
    echo: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(ECHO_METHOD)
    payload = struct.pack(">I", response_size) + b"\0" * max(0, request_size - 4)
    meta = metadata("device")

    async def call(index: int) -> object:
        reply: bytes = await echo(payload, metadata=meta)
        assert len(reply) == response_size
        return reply

    return call


# ------------------------------------------------------------------------ storage baselines


def _fingerprint(content: str) -> str:
    body = {
        "delivery": "new_turn",
        "target_turn_id": None,
        "mode": "agent",
        "content": content,
        "references": None,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class StorageBaseline:
    """The raw single-transaction SQL of the rows each RPC writes or reads."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def submit(self, session_id: str) -> None:
        """Turn insert, user message insert and Session update in one write transaction."""
        now = time.time_ns() // 1_000_000
        turn_id = f"turn-{uuid.uuid4()}"
        submit_id = f"submit-{session_id}"
        async with self.engine.connect() as connection:
            connection = await connection.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
            async with connection.begin():
                await connection.execute(
                    insert(Turn).values(
                        workspace_id=WORKSPACE,
                        session_id=session_id,
                        turn_id=turn_id,
                        client_submit_id=submit_id,
                        submit_fingerprint=_fingerprint(PROMPT),
                        phase="queued",
                        origin="user",
                        delivery="new_turn",
                        mode="agent",
                        version=1,
                        created_at_unix_ms=now,
                        updated_at_unix_ms=now,
                    )
                )
                await connection.execute(
                    insert(Message).values(
                        workspace_id=WORKSPACE,
                        session_id=session_id,
                        message_id=f"client-submit:user:{submit_id}",
                        sequence=1,
                        version=1,
                        turn_id=turn_id,
                        occurred_at_unix_ms=now,
                        created_at_unix_ms=now,
                        updated_at_unix_ms=now,
                        role="user",
                        kind="text",
                        payload_json=json.dumps({"text": PROMPT}),
                        user_visible_assistant_response=False,
                        references_json="[]",
                    )
                )
                await connection.execute(
                    update(Session)
                    .where(Session.workspace_id == WORKSPACE, Session.session_id == session_id)
                    .values(
                        active_turn_id=turn_id,
                        updated_at_unix_ms=now,
                        message_version=Session.message_version + 1,
                        next_message_sequence=Session.next_message_sequence + 1,
                    )
                )

    async def replay(self, session_id: str) -> None:
        """The user message, its Turn and the Session in one read transaction."""
        submit_id = f"submit-{session_id}"
        async with self.engine.begin() as connection:
            await connection.execute(
                select(Message).where(
                    Message.workspace_id == WORKSPACE,
                    Message.session_id == session_id,
                    Message.message_id == f"client-submit:user:{submit_id}",
                )
            )
            await connection.execute(
                select(Turn).where(
                    Turn.workspace_id == WORKSPACE,
                    Turn.session_id == session_id,
                    Turn.client_submit_id == submit_id,
                )
            )
            await connection.execute(select(Session).where(*_session_key(session_id)))

    async def get_session(self, session_id: str) -> None:
        """Session, active and latest Turn, pending Interactions, the live tree."""
        async with self.engine.begin() as connection:
            row = (await connection.execute(select(Session).where(*_session_key(session_id)))).one()
            if row.active_turn_id is not None:
                await connection.execute(
                    select(Turn).where(
                        Turn.workspace_id == WORKSPACE,
                        Turn.session_id == session_id,
                        Turn.turn_id == row.active_turn_id,
                    )
                )
            await connection.execute(
                select(Turn)
                .where(
                    Turn.workspace_id == WORKSPACE,
                    Turn.session_id == session_id,
                    Turn.retracted_at_unix_ms.is_(None),
                )
                .order_by(Turn.created_at_unix_ms.desc(), Turn.turn_id.desc())
                .limit(1)
            )
            await connection.execute(
                select(Interaction).where(
                    Interaction.workspace_id == WORKSPACE,
                    Interaction.session_id == session_id,
                    Interaction.status == "pending",
                )
            )
            await connection.execute(
                select(Session).where(
                    Session.workspace_id == WORKSPACE,
                    Session.root_session_id == session_id,
                    Session.deleted_at_unix_ms.is_(None),
                )
            )

    async def page(self, session_id: str) -> None:
        """The Session row and a page of ``PAGE + 1`` messages by version."""
        async with self.engine.begin() as connection:
            await connection.execute(select(Session).where(*_session_key(session_id)))
            rows = await connection.execute(
                select(Message)
                .where(
                    and_(
                        Message.workspace_id == WORKSPACE,
                        Message.session_id == session_id,
                        Message.version > 0,
                    )
                )
                .order_by(Message.version)
                .limit(PAGE + 1)
            )
            assert len(rows.all()) == PAGE + 1


def _session_key(session_id: str) -> tuple[Any, ...]:
    return (Session.workspace_id == WORKSPACE, Session.session_id == session_id)


# ------------------------------------------------------------------------ one backend


@dataclass
class Comparison:
    """One RPC at one concurrency beside its two baselines."""

    rpc: str
    concurrency: int
    host: Summary
    echo: Summary
    storage: Summary
    host_cpu_ms_per_request: float | None
    echo_cpu_ms_per_request: float | None
    storage_cpu_ms_per_request: float | None
    request_bytes: int
    response_bytes: int
    extra: dict[str, Any] = field(default_factory=dict)

    def throughput_ratio(self, baseline: Summary) -> float:
        """Host throughput over the baseline's."""
        assert self.host.throughput_per_s
        assert baseline.throughput_per_s
        return self.host.throughput_per_s / baseline.throughput_per_s

    def as_json(self) -> dict[str, Any]:
        """The result-file form."""
        return {
            "rpc": self.rpc,
            "concurrency": self.concurrency,
            "request_bytes": self.request_bytes,
            "response_bytes": self.response_bytes,
            "host": asdict(self.host),
            "echo": asdict(self.echo),
            "storage": asdict(self.storage),
            "throughput_ratio_to_echo": round(self.throughput_ratio(self.echo), 3),
            "throughput_ratio_to_storage": round(self.throughput_ratio(self.storage), 3),
            "latency_p50_ratio_to_echo": round(self.host.p50_ms / self.echo.p50_ms, 3),
            "latency_p50_ratio_to_storage": round(self.host.p50_ms / self.storage.p50_ms, 3),
            "host_cpu_ms_per_request": _round(self.host_cpu_ms_per_request),
            "echo_cpu_ms_per_request": _round(self.echo_cpu_ms_per_request),
            "storage_cpu_ms_per_request": _round(self.storage_cpu_ms_per_request),
            **self.extra,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class BackendRun:
    """Everything measured on one backend: setup, then each RPC beside its baselines."""

    def __init__(
        self,
        backend: str,
        url: str,
        host: ServerProcess,
        echo: ServerProcess,
        requests: int,
        warmup: int,
        rpcs: frozenset[str],
    ) -> None:
        self.backend = backend
        self.rpcs = rpcs
        self.url = url
        self.host = host
        self.echo = echo
        self.requests = requests
        self.warmup = warmup
        self.results: list[Comparison] = []
        self.submitted: list[str] = []
        """Sessions whose ``new_turn`` succeeded at concurrency 32: the replay targets."""

    async def run(self) -> list[Comparison]:
        """Set up, measure every RPC and return the comparisons."""
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        storage = StorageWorker(self.url)
        async with (
            grpc.aio.insecure_channel(self.host.address, options=options) as host_channel,
            grpc.aio.insecure_channel(self.echo.address, options=options) as echo_channel,
        ):
            stub = host_pb2_grpc.HostServiceStub(host_channel)
            runtime = BenchRuntime(host_channel)
            try:
                await self._setup(stub, runtime)
                await self._measure_all(stub, echo_channel, storage)
            finally:
                await runtime.close()
                storage.stop()
        return self.results

    async def _setup(self, stub: host_pb2_grpc.HostServiceAsyncStub, runtime: BenchRuntime) -> None:
        await register_target(stub)
        await runtime.hello()
        per_series = self.warmup + self.requests
        kinds = [
            kind
            for kind, needed_by in (
                ("new", {"SendInput new", "SendInput replay"}),
                ("raw", {"SendInput new"}),
            )
            if needed_by & self.rpcs
        ]
        session_ids = [LIST_SESSION, "sample"] + [
            f"{kind}-c{concurrency}-{index}"
            for kind in kinds
            for concurrency in CONCURRENCIES
            for index in range(per_series)
        ]
        started = time.perf_counter()
        # Setup writes at a modest concurrency: 32 concurrent SQLite writers for minutes can
        # starve one past the 5 s busy timeout (see the README's findings).
        await create_sessions(stub, session_ids)
        if "SendInput replay" in self.rpcs and "SendInput new" not in self.rpcs:

            async def submit(index: int) -> None:
                await stub.SendInput(
                    submit_request(f"new-c32-{index}"), metadata=metadata("device")
                )
                self.submitted.append(f"new-c32-{index}")

            await drive(submit, per_series, SETUP_CONCURRENCY)
        print(
            f"[{self.backend}] created {len(session_ids)} Sessions in "
            f"{time.perf_counter() - started:.1f} s"
        )
        first = await stub.SendInput(submit_request(LIST_SESSION), metadata=metadata("device"))
        turn_id = first.turn.turn_id
        for batch in range(0, LIST_MESSAGES - 1, 50):
            items = [
                runtime_pb2.ReportItem(
                    message_snapshot=runtime_pb2.MessageSnapshot(
                        message_id=f"assistant-{index}",
                        turn_id=turn_id,
                        role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
                        kind=canonical_pb2.MESSAGE_KIND_TEXT,
                        user_visible_assistant_response=True,
                        occurred_at_unix_ms=1_780_000_000_000 + index,
                        payload_json=json.dumps({"text": f"{index}: {ASSISTANT_TEXT}"}),
                    )
                )
                for index in range(batch, min(batch + 50, LIST_MESSAGES - 1))
            ]
            result = await runtime.report(LIST_SESSION, items)
            assert result.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, result

    async def _measure_all(
        self,
        stub: host_pb2_grpc.HostServiceAsyncStub,
        echo_channel: grpc.aio.Channel,
        storage: StorageWorker,
    ) -> None:
        device = metadata("device")
        get_request = host_pb2.GetSessionRequest(workspace_id=WORKSPACE, session_id=LIST_SESSION)
        page_request = host_pb2.ListSessionMessagesRequest(
            workspace_id=WORKSPACE, session_id=LIST_SESSION, after_version=0, limit=PAGE
        )
        sample_new = await stub.SendInput(submit_request("sample"), metadata=device)
        sample_replay = await stub.SendInput(submit_request("sample"), metadata=device)
        assert sample_replay.replayed
        sample_get = await stub.GetSession(get_request, metadata=device)
        sample_page = await stub.ListSessionMessages(page_request, metadata=device)
        assert len(sample_page.messages) == PAGE
        assert sample_page.has_more

        async def get_session(index: int) -> object:
            return await stub.GetSession(get_request, metadata=device)

        async def page(index: int) -> object:
            return await stub.ListSessionMessages(page_request, metadata=device)

        def new_turn(concurrency: int) -> Callable[[int], Awaitable[object]]:
            async def call(index: int) -> object:
                session_id = f"new-c{concurrency}-{index}"
                response = await stub.SendInput(submit_request(session_id), metadata=device)
                assert not response.replayed
                if concurrency == CONCURRENCIES[-1]:
                    self.submitted.append(session_id)
                return response

            return call

        async def replay(index: int) -> object:
            session_id = self.submitted[index % len(self.submitted)]
            response = await stub.SendInput(submit_request(session_id), metadata=device)
            assert response.replayed
            return response

        for concurrency in CONCURRENCIES:
            await self._compare(
                "GetSession",
                concurrency,
                get_session,
                storage.calls("get_session"),
                echo_channel,
                (get_request.ByteSize(), sample_get.ByteSize()),
            )
        for concurrency in CONCURRENCIES:
            await self._compare(
                "SendInput new",
                concurrency,
                new_turn(concurrency),
                storage.calls("submit"),
                echo_channel,
                (submit_request("new-c32-0").ByteSize(), sample_new.ByteSize()),
            )
        storage.submitted = self.submitted
        for concurrency in CONCURRENCIES:
            await self._compare(
                "SendInput replay",
                concurrency,
                replay,
                storage.calls("replay"),
                echo_channel,
                (submit_request("new-c32-0").ByteSize(), sample_replay.ByteSize()),
            )
        for concurrency in CONCURRENCIES:
            await self._compare(
                "ListSessionMessages",
                concurrency,
                page,
                storage.calls("page"),
                echo_channel,
                (page_request.ByteSize(), sample_page.ByteSize()),
            )

    async def _compare(
        self,
        rpc: str,
        concurrency: int,
        host_call: Callable[[int], Awaitable[object]],
        storage_call: RemoteCalls,
        echo_channel: grpc.aio.Channel,
        sizes: tuple[int, int],
    ) -> None:
        if rpc not in self.rpcs:
            return
        label = f"{rpc} c{concurrency}"
        host, echo, storage = await interleaved(
            [
                (host_call, self.host),
                (echo_call(echo_channel, *sizes), self.echo),
                (storage_call, storage_call.worker),
            ],
            self.requests,
            self.warmup,
            concurrency,
            postgres=self.backend == "postgres",
        )
        comparison = Comparison(
            rpc=rpc,
            concurrency=concurrency,
            host=host.summary(f"host {label}"),
            echo=echo.summary(f"echo {label}"),
            storage=storage.summary(f"storage {label}"),
            host_cpu_ms_per_request=_per_request(host),
            echo_cpu_ms_per_request=_per_request(echo),
            storage_cpu_ms_per_request=_per_request(storage),
            request_bytes=sizes[0],
            response_bytes=sizes[1],
        )
        comparison.extra["machine_cpu_ms_per_request"] = {
            name: round(series.machine_cpu_s * 1000 / max(1, len(series.latencies_ms)), 3)
            for name, series in (("host", host), ("echo", echo), ("storage", storage))
        }
        if self.backend == "postgres":
            # Host's side only: its pooled backends live through the series, while the
            # storage worker's may end within it and take their CPU time with them.
            comparison.extra["database_cpu_ms_per_request"] = {
                "host": round(host.database_cpu_s * 1000 / max(1, len(host.latencies_ms)), 3)
            }
        errors = {
            name: series.errors
            for name, series in (("host", host), ("echo", echo), ("storage", storage))
            if series.errors
        }
        if errors:
            comparison.extra["errors"] = errors
            print(f"[{self.backend}] {label} failed calls: {errors}")
        self.results.append(comparison)
        print(f"[{self.backend}] {ratio_line(comparison.host, comparison.echo)}")
        print(f"[{self.backend}] {ratio_line(comparison.host, comparison.storage)}")


def _per_request(series: Series) -> float | None:
    if series.server_cpu_s is None:
        return None
    return series.server_cpu_s * 1000 / len(series.latencies_ms)


async def create_sessions(stub: host_pb2_grpc.HostServiceAsyncStub, session_ids: list[str]) -> None:
    """Create idle Sessions of the bench target at ``SETUP_CONCURRENCY``; fail on any error."""
    created = await drive(
        lambda index: stub.CreateSession(
            host_pb2.CreateSessionRequest(
                workspace_id=WORKSPACE,
                agent_target_id=TARGET_ID,
                session_id=session_ids[index],
                cwd="/nonexistent/bench",
                title=f"bench {session_ids[index]}",
            ),
            metadata=metadata("admin"),
        ),
        len(session_ids),
        SETUP_CONCURRENCY,
    )
    if created.errors:
        raise RuntimeError(f"CreateSession failed during setup: {created.errors}")


async def register_target(stub: host_pb2_grpc.HostServiceAsyncStub) -> None:
    """Register the benchmark's agent target (the bench runtime's provider)."""
    await stub.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(
            target=host_pb2.AgentTarget(
                agent_target_id=TARGET_ID,
                provider=PROVIDER,
                display_name="Bench",
                enabled=True,
                launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref="bench:default"),
                capabilities=canonical_pb2.RuntimeCapabilities(guidance=True, interrupt=True),
                subagents=[host_pb2.SubagentDescriptor(name="explorer", description="Reads")],
            )
        ),
        metadata=metadata("admin"),
    )


def submit_request(session_id: str) -> host_pb2.SendInputRequest:
    """The benchmark's ``new_turn`` submission to ``session_id`` (one submit id per Session)."""
    return host_pb2.SendInputRequest(
        workspace_id=WORKSPACE,
        session_id=session_id,
        client_submit_id=f"submit-{session_id}",
        delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
        mode=canonical_pb2.COMPOSER_MODE_AGENT,
        content=PROMPT,
    )


# ------------------------------------------------------------------------ report


def table(backend: str, results: list[Comparison]) -> str:
    """A Markdown table of one backend's results."""
    lines = [
        f"{backend}:",
        "| RPC | conc | host req/s | host p50 / p99 ms | echo req/s | storage req/s "
        "| x echo | x storage | host CPU ms/req | machine CPU ms/req host / echo "
        "| database CPU ms/req |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        host, echo, storage = result.host, result.echo, result.storage
        failed = sum(result.extra.get("errors", {}).get("host", {}).values())
        name = f"{result.rpc} ({failed} failed)" if failed else result.rpc
        lines.append(
            f"| {name} | {result.concurrency} | {host.throughput_per_s:.0f} "
            f"| {host.p50_ms:.2f} / {host.p99_ms:.2f} | {echo.throughput_per_s:.0f} "
            f"| {storage.throughput_per_s:.0f} | {result.throughput_ratio(echo):.2f} "
            f"| {result.throughput_ratio(storage):.2f} "
            f"| {result.host_cpu_ms_per_request or 0:.2f} "
            f"| {_machine(result)} | {_database(result)} |"
        )
    return "\n".join(lines)


def _machine(result: Comparison) -> str:
    machine = result.extra.get("machine_cpu_ms_per_request", {})
    return f"{machine.get('host', 0):.2f} / {machine.get('echo', 0):.2f}"


def _database(result: Comparison) -> str:
    database = result.extra.get("database_cpu_ms_per_request")
    return "—" if database is None else f"{database['host']:.2f}"


def verdicts(results: list[Comparison]) -> dict[str, dict[str, Any]]:
    """The targets, checked at concurrency 32."""
    checked: dict[str, dict[str, Any]] = {}
    for result in results:
        if result.concurrency == 32 and result.rpc in TARGETS:
            ratio = result.throughput_ratio(result.echo)
            checked[result.rpc] = {
                "target_ratio_to_echo": TARGETS[result.rpc],
                "ratio_to_echo": round(ratio, 3),
                "met": ratio >= TARGETS[result.rpc],
            }
    return checked


def main() -> None:
    """Run the benchmark and write ``bench/results/host_bench.json``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--requests", type=int, default=400, help="measured calls per series")
    parser.add_argument("--warmup", type=int, default=None, help="default: requests / 10")
    parser.add_argument(
        "--rpcs",
        default=",".join(RPCS),
        help="comma-separated subset of: " + ", ".join(RPCS) + " (for profiling one of them)",
    )
    parser.add_argument("--serve-echo", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--storage-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo is not None:
        asyncio.run(serve_echo(args.serve_echo))
        return
    if args.storage_worker is not None:
        asyncio.run(serve_storage(args.storage_worker))
        return
    warmup = args.warmup if args.warmup is not None else max(32, args.requests // 10)
    rpcs = frozenset(name.strip() for name in args.rpcs.split(",") if name.strip())
    if unknown := rpcs - set(RPCS):
        parser.error(f"unknown RPCs: {', '.join(sorted(unknown))}")
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    report: dict[str, Any] = {
        "requests_per_series": args.requests,
        "warmup_per_series": warmup,
        "concurrency": list(CONCURRENCIES),
        "cpus": os.cpu_count(),
        "backends": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        echo = start_echo(tmp)
        try:
            for backend in backends:
                with database(backend, tmp) as url:
                    host = start_host(tmp, url)
                    print(f"[{backend}] host pid {host.process.pid} at {host.address}")
                    try:
                        results = asyncio.run(
                            BackendRun(backend, url, host, echo, args.requests, warmup, rpcs).run()
                        )
                    finally:
                        host.stop()
                print(table(backend, results))
                report["backends"][backend] = {
                    "results": [result.as_json() for result in results],
                    "targets": verdicts(results),
                }
        finally:
            echo.stop()
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    for backend, outcome in report["backends"].items():
        for rpc, verdict in outcome["targets"].items():
            print(
                f"target [{backend}] {rpc} c32: {verdict['ratio_to_echo']:.2f} x echo "
                f"(target {verdict['target_ratio_to_echo']}) "
                f"{'met' if verdict['met'] else 'NOT met'}"
            )
    path = write_results("host_bench", report)
    print(f"wrote {path} in {report['elapsed_s']} s")


if __name__ == "__main__":
    main()
