"""A newcomer's path through the README, against a real ``tutti up`` (OPS-2, CON-3).

Each test starts ``tutti up --base-port 0`` with a private ``HOME`` (so the running-suite
record is the test's own) and no ``TUTTI_*`` variables, the way a fresh shell has none.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import Message

from conformance.runner import import_all_contracts
from tests.support.readme import GrpcurlExample, grpcurl_examples, shell_blocks, shell_commands
from tests.support.servers import TEST_PRINCIPALS
from tests.support.suite_process import SuiteProcess, running_suite
from tutti.suite import COMPANIONS, SUITE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _fresh_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(HOME=str(home), TUTTI_LOG_FORMAT="text", **extra)
    return env


def _record(home: Path) -> Path:
    return home / ".local" / "share" / "tutti" / "run" / "current-suite.json"


def _tutti(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tutti", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass
class _ScriptsUp:
    """A suite started the way ``./scripts/up`` starts it, in a fresh clone's directory."""

    suite: SuiteProcess
    home: Path
    work: Path

    @property
    def data(self) -> Path:
        return self.work / ".data"

    @property
    def cli_env(self) -> dict[str, str]:
        """A fresh shell: no TUTTI_DATA_DIR, no address (the record says where)."""
        return _fresh_env(self.home)


@pytest.fixture(scope="module")
def scripts_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_ScriptsUp]:
    root = tmp_path_factory.mktemp("newcomer")
    home, work = root / "home", root / "clone"
    work.mkdir()
    # What ./scripts/up runs: a data directory that is not the CLI's default one.
    env = _fresh_env(home, TUTTI_DEMO_STEP_DELAY_SECONDS="0.01")
    command = [sys.executable, "-m", "tutti", "up", "--data-dir", ".data", "--base-port", "0"]
    with running_suite(Path(".data"), env=env, cwd=work, command=command) as suite:
        suite.wait_ready()
        yield _ScriptsUp(suite, home, work)


def _task_call_line(output: str) -> str:
    return next(line for line in output.splitlines() if '"toolName":"Task"' in line)


@pytest.mark.spec("OPS-2", "ARCH-3", "HOST-OBS-2")
def test_the_session_walkthrough_finds_a_suite_started_like_scripts_up(
    scripts_up: _ScriptsUp, tmp_path: Path
) -> None:
    record = json.loads(_record(scripts_up.home).read_text())
    assert record["dataDir"] == str(scripts_up.data.resolve())
    assert record["pid"] == scripts_up.suite.process.pid
    assert set(record["addresses"]) == {*SUITE, *COMPANIONS}

    env, work = scripts_up.cli_env, scripts_up.work
    created = _tutti("session", "create", env=env, cwd=work)
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    assert (scripts_up.data / "run" / "cli-session").read_text().strip() == session_id

    followed = _tutti("session", "send", "@explorer look around", "--follow", env=env)
    assert followed.returncode == 0, followed.stderr
    assert "TURN_OUTCOME_COMPLETED" in followed.stdout
    task_call = _task_call_line(followed.stdout)
    assert re.search(r" … \(\d+ more bytes\)$", task_call), task_call

    # The reference backends are found the same way.
    loaded = _tutti("refdata", "load", "docs/examples/refdata.yaml", "--workspace", "ws-1", env=env)
    assert loaded.returncode == 0, loaded.stderr

    # An explicit data directory wins over the record.
    elsewhere = _tutti("session", "create", env=dict(env, TUTTI_DATA_DIR=str(tmp_path / "other")))
    assert elsewhere.returncode == 2
    assert "no CLI token" in elsewhere.stderr
    assert str(tmp_path / "other") in elsewhere.stderr


def _call(channel: grpc.Channel, example: GrpcurlExample, token: str) -> dict[str, Any]:
    """What grpcurl does with the example: JSON in, a unary call, JSON out."""
    import_all_contracts()
    assert example.service is not None
    assert example.method is not None
    method = descriptor_pool.Default().FindMethodByName(f"{example.service}.{example.method}")
    request = message_factory.GetMessageClass(method.input_type)()
    json_format.ParseDict(example.body or {}, request)
    response_class = message_factory.GetMessageClass(method.output_type)
    call: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
        f"/{example.service}/{example.method}",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=response_class.FromString,
    )
    response = call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=30)
    return json_format.MessageToDict(response)


def _wait_idle(channel: grpc.Channel, token: str, workspace: str, session: str) -> None:
    """Wait until the Session has no active Turn (a human reads the reply first)."""
    get = GrpcurlExample(
        command="GetSession",
        address="",
        service="agentactivity.host.v1.HostService",
        method="GetSession",
        body={"workspaceId": workspace, "sessionId": session},
        authorized=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _call(channel, get, token)["session"].get("activeTurnId"):
            return
        time.sleep(0.1)
    raise AssertionError(f"Session {session} stayed active")


@pytest.mark.spec("OPS-2", "ARCH-3", "HOST-TGT-1")
def test_the_readme_host_grpcurl_examples_work_and_leave_the_demo_agent_intact(
    scripts_up: _ScriptsUp,
) -> None:
    # Every HostService example of the README, in its order, as grpcurl would send it.
    token = (scripts_up.data / "auth" / "cli-token").read_text().strip()
    host = json.loads(_record(scripts_up.home).read_text())["addresses"]["host"]
    examples = [e for e in grpcurl_examples() if e.service == "agentactivity.host.v1.HostService"]
    assert len(examples) >= 10
    with grpc.insecure_channel(host) as channel:
        for example in examples:
            body = example.body or {}
            if example.method == "SendInput":
                _wait_idle(channel, token, body["workspaceId"], body["sessionId"])
            try:
                response = _call(channel, example, token)
            except grpc.RpcError as error:
                message = f"{example.command}\n-> {error.code()}: {error.details()}"
                raise AssertionError(message) from None
            if example.method == "SendInput" or "initialInput" in body:
                assert response["turn"]["turnId"], response  # a Turn on the demo agent

    # The demo agent's target is still its own: @explorer still delegates.
    delegated = _tutti(
        "session", "send", "@explorer look around", "--follow", env=scripts_up.cli_env
    )
    assert delegated.returncode == 0, delegated.stderr
    assert "explorer" in _task_call_line(delegated.stdout)


@pytest.mark.spec("OPS-2", "OPS-3")
def test_a_clean_stop_removes_the_suite_record(scripts_up: _ScriptsUp) -> None:
    assert _record(scripts_up.home).exists()
    assert scripts_up.suite.stop() == 0, scripts_up.suite.output
    assert not _record(scripts_up.home).exists()
    after = _tutti("session", "create", env=scripts_up.cli_env, cwd=scripts_up.work)
    assert after.returncode == 2
    assert after.stderr.startswith("error: no CLI token")
    assert "Traceback" not in after.stderr


@pytest.mark.spec("CON-3", "OPS-2")
def test_the_readme_conformance_commands_pass_against_tutti_up(tmp_path: Path) -> None:
    block = next(b for b in shell_blocks() if "tutti conformance provision" in b)
    provision, up, run = shell_commands(block)
    assert " up " in f" {up} "
    data, tokens = tmp_path / "conformance", tmp_path / "conformance-tokens"

    documented_data, documented_tokens = "/tmp/conformance", "/tmp/conformance-tokens"  # noqa: S108

    def local(command: str) -> str:
        # The documented paths, moved into this test's directory.
        command = command.replace(documented_tokens, str(tokens))
        return command.replace(documented_data, str(data))

    env = _fresh_env(tmp_path / "home")
    provisioned = subprocess.run(
        ["/bin/bash", "-c", local(provision)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert provisioned.returncode == 0, provisioned.stderr
    assert len(tokens.read_text().split()) == len(TEST_PRINCIPALS)  # one --token per principal

    up_command = ["/bin/bash", "-c", f"exec {local(up)} --base-port 0"]
    with running_suite(data, env=env, cwd=ROOT, command=up_command) as suite:
        suite.wait_ready()
        port = (data / "run" / "maintenance.port").read_text().strip()
        command = local(run).replace("127.0.0.1:50054", f"127.0.0.1:{port}")
        assert shlex.split(command)[:3] == [".venv/bin/tutti", "conformance", "run"]
        result = subprocess.run(
            ["/bin/bash", "-c", command],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "retention.yaml:" in result.stdout
        assert "steps, ok" in result.stdout
        assert suite.stop() == 0, suite.output
