"""A newcomer's path through the README, against a real ``tutti up`` (OPS-2, CON-3).

Each test starts ``tutti up --base-port 0`` with a private ``HOME`` (so the running-suite
record is the test's own) and no ``TUTTI_*`` variables, the way a fresh shell has none.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tutti.suite import COMPANIONS, SUITE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


class _Suite:
    """One ``tutti up`` process; its output read by one thread, every wait bounded."""

    def __init__(self, command: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, ""):
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith("suite ready") for line in self.lines):
                return
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"tutti up did not become ready:\n{self.output}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as a service manager would; the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        """Kill what is left (the whole process group), then release the pipe."""
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._reader.join(timeout=10)  # EOF once every writer is gone
        assert self.process.stdout is not None
        if not self._reader.is_alive():
            self.process.stdout.close()


@contextmanager
def _running(command: Sequence[str], env: dict[str, str], cwd: Path) -> Iterator[_Suite]:
    suite = _Suite(command, env, cwd)
    try:
        yield suite
    finally:
        suite.close()


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


@pytest.mark.spec("OPS-2", "ARCH-3", "HOST-OBS-2")
def test_the_session_walkthrough_finds_a_suite_started_like_scripts_up(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "clone"
    work.mkdir()
    # What ./scripts/up runs: a data directory that is not the CLI's default one.
    env = _fresh_env(home, TUTTI_DEMO_STEP_DELAY_SECONDS="0.01")
    command = [sys.executable, "-m", "tutti", "up", "--data-dir", ".data", "--base-port", "0"]
    with _running(command, env, work) as suite:
        suite.wait_ready()
        record = json.loads(_record(home).read_text())
        assert record["dataDir"] == str((work / ".data").resolve())
        assert record["pid"] == suite.process.pid
        assert set(record["addresses"]) == {*SUITE, *COMPANIONS}

        cli_env = _fresh_env(home)  # no TUTTI_DATA_DIR, no address: the record says where
        created = _tutti("session", "create", env=cli_env, cwd=work)
        assert created.returncode == 0, created.stderr
        session_id = created.stdout.strip()
        assert (work / ".data" / "run" / "cli-session").read_text().strip() == session_id

        followed = _tutti("session", "send", "@explorer look around", "--follow", env=cli_env)
        assert followed.returncode == 0, followed.stderr
        assert "TURN_OUTCOME_COMPLETED" in followed.stdout
        task_call = next(
            line for line in followed.stdout.splitlines() if '"toolName":"Task"' in line
        )
        assert re.search(r" … \(\d+ more bytes\)$", task_call), task_call

        # The reference backends are found the same way.
        loaded = _tutti(
            "refdata", "load", "docs/examples/refdata.yaml", "--workspace", "ws-1", env=cli_env
        )
        assert loaded.returncode == 0, loaded.stderr

        # An explicit data directory wins over the record.
        elsewhere = _tutti(
            "session", "create", env=dict(cli_env, TUTTI_DATA_DIR=str(tmp_path / "other"))
        )
        assert elsewhere.returncode == 2
        assert "no CLI token" in elsewhere.stderr
        assert str(tmp_path / "other") in elsewhere.stderr

        assert suite.stop() == 0, suite.output
    assert not _record(home).exists(), "a clean stop removes the record"
    after = _tutti("session", "create", env=cli_env, cwd=work)
    assert after.returncode == 2
    assert after.stderr.startswith("error: no CLI token")
    assert "Traceback" not in after.stderr


def _readme_block(needle: str) -> list[str]:
    """The shell commands of the README code block containing ``needle``."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    block = next(b for b in blocks if needle in b)
    commands = []
    for logical in block.replace("\\\n", " ").splitlines():
        command = logical.split("#", 1)[0].strip()
        if command:
            commands.append(command)
    return commands


@pytest.mark.spec("CON-3", "OPS-2")
def test_the_readme_conformance_commands_pass_against_tutti_up(tmp_path: Path) -> None:
    provision, up, run = _readme_block("tutti conformance provision")
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
    assert len(tokens.read_text().split()) == 4

    up_command = ["/bin/bash", "-c", f"exec {local(up)} --base-port 0"]
    with _running(up_command, env, ROOT) as suite:
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
