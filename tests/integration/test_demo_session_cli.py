"""The demo agent end to end: ``tutti up`` + ``tutti session create/send/answer`` (ARCH-3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.suite_process import running_suite

pytestmark = pytest.mark.slow


def _tutti(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tutti", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _wait_for(lines: list[str], needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(needle in line for line in lines):
            return
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not seen in:\n{''.join(lines)}")


def _pump(stream: object, into: list[str]) -> threading.Thread:
    def read() -> None:
        for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
            into.append(line)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.spec("ARCH-3", "HOST-RT-1", "HOST-RT-2", "HOST-OBS-2", "OPS-2")
def test_a_newcomer_watches_the_demo_agent_work_and_answers_its_question(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    env.update(TUTTI_DEMO_STEP_DELAY_SECONDS="0.01", TUTTI_LOG_FORMAT="text")
    with running_suite(tmp_path, env={"TUTTI_DEMO_STEP_DELAY_SECONDS": "0.01"}) as suite:
        suite.wait_ready()
        host = f"127.0.0.1:{suite.port('host')}"
        cli_env = dict(env, TUTTI_DATA_DIR=str(tmp_path), TUTTI_HOST_ADDRESS=host)

        created = _tutti("session", "create", "--title", "demo", env=cli_env)
        assert created.returncode == 0, created.stderr
        session_id = created.stdout.strip()
        assert session_id

        # 1. A plain prompt: the reply streams, the pretend tool's output streams, it settles.
        plain = _tutti("session", "send", "hello there", "--follow", env=cli_env)
        assert plain.returncode == 0, plain.stderr
        assert "Demo agent here." in plain.stdout
        assert "[tool output]" in plain.stdout
        assert "[1] hello there" in plain.stdout
        assert "TURN_OUTCOME_COMPLETED" in plain.stdout

        # 2. A prompt asking for permission waits until the CLI answers it.
        follower = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tutti",
                "session",
                "send",
                "please ask permission first",
                "--follow",
            ],
            env=cli_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        follow_output: list[str] = []
        reader = _pump(follower.stdout, follow_output)
        try:
            _wait_for(follow_output, "[interaction]", 30)
            answered = _tutti("session", "answer", "allow", env=cli_env)
            assert answered.returncode == 0, answered.stderr
            assert follower.wait(timeout=60) == 0, "".join(follow_output)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait(timeout=10)
            # The pipe is closed only once its reader has seen EOF (bounded).
            reader.join(timeout=10)
            assert not reader.is_alive(), "the follower's output pipe stayed open"
            assert follower.stdout is not None
            follower.stdout.close()
        text = "".join(follow_output)
        assert "I ran a pretend tool" in text
        assert "TURN_OUTCOME_COMPLETED" in text

        # 3. An @agent delegation: the demo reports the Task call it would make.
        delegated = _tutti("session", "send", "@explorer look around", "--follow", env=cli_env)
        assert delegated.returncode == 0, delegated.stderr
        assert '"toolName":"Task"' in delegated.stdout.replace(" ", "")
        assert "explorer" in delegated.stdout

        suite.signal(signal.SIGINT)
        assert suite.wait_exit(timeout=30) == 0, suite.output
