"""``tutti up`` as a real process under test, with output capture that cannot deadlock.

The suite runs in a session of its own (so a test can signal it like a terminal would and,
as a last resort, kill its whole process group). One daemon thread reads its combined output
into a list; the pipe is closed only after that thread has seen EOF, and every wait is
bounded. :meth:`SuiteProcess.close` is the safety net: it kills whatever is left, including
children that would have outlived the supervisor, so a failing test never leaves servers
behind to disturb the tests after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tutti.suite import COMPANIONS, SUITE

__all__ = ["SuiteProcess", "process_alive", "running_suite"]

READY_LINE = "suite ready"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


class SuiteProcess:
    """One ``tutti up --data-dir DIR --base-port 0`` process.

    Args:
        data_dir: its data directory.
        args: extra ``tutti up`` arguments.
        env: extra environment (``TUTTI_*`` of the test process are not inherited; HOME is
            private unless given here).
        ignore_sigint: start it with SIGINT ignored, as a background job of a
            non-interactive shell is.
        cwd: its working directory (a relative ``data_dir`` is relative to it).
        command: run this instead of ``tutti up --data-dir DATA_DIR --base-port 0 ARGS``
            (a documented command line); it must start ``tutti up`` on ``data_dir``.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        ignore_sigint: bool = False,
        cwd: Path | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.data_dir = data_dir if cwd is None or data_dir.is_absolute() else cwd / data_dir
        base = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
        base.setdefault("TUTTI_LOG_FORMAT", "text")
        # A private HOME: the per-user running-suite record (tutti/suite_record.py) of a
        # test suite must not be found by a CLI the developer runs meanwhile.
        base["HOME"] = str(self.data_dir.parent / f"{self.data_dir.name}-home")
        base.update(env or {})
        if command is None:
            command = [
                sys.executable,
                "-m",
                "tutti",
                "up",
                "--data-dir",
                str(data_dir),
                "--base-port",
                "0",
                *args,
            ]
        if ignore_sigint:
            # `trap "" INT` sets SIG_IGN, which exec passes on, exactly like `cmd &` in a script.
            command = ["/bin/sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]
        self.process = subprocess.Popen(
            list(command),
            env=base,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="suite-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, ""):
            self.lines.append(line)

    @property
    def output(self) -> str:
        """Everything printed so far."""
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        """Wait until a printed line contains ``needle``.

        Raises:
            AssertionError: not seen within ``timeout`` or the process exited first.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not printed by tutti up:\n{self.output}")

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait for the ready line."""
        self.wait_for(READY_LINE, timeout)

    def port(self, name: str) -> int:
        """The bound port of service ``name``."""
        return int((self.data_dir / "run" / f"{name}.port").read_text())

    def child_pids(self) -> dict[str, int]:
        """The pid of every service process the supervisor started."""
        pids = {}
        for name in (*SUITE, *COMPANIONS):
            path = self.data_dir / "run" / f"{name}.pid"
            if path.exists():
                pids[name] = int(path.read_text())
        return pids

    def all_pids(self) -> dict[str, int]:
        """The pid of every process it started, replicas and nats-server included."""
        pids = {}
        for path in sorted((self.data_dir / "run").glob("*.pid")):
            text = path.read_text().strip()
            if text.isdigit():  # a file being written reads empty
                pids[path.stem] = int(text)
        return pids

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the supervisor alone (not its process group)."""
        self.process.send_signal(signum)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as a service manager would; the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float) -> int:
        """The supervisor's exit code; raises ``subprocess.TimeoutExpired`` past ``timeout``."""
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        """Kill whatever is still running, then release the pipe (bounded throughout)."""
        pids = self.all_pids()
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        for pid in pids.values():
            if process_alive(pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        # EOF arrives once every writer (supervisor and children) is gone.
        self._reader.join(timeout=10)
        if self._reader.is_alive():
            raise AssertionError("the output pipe of tutti up stayed open after every kill")
        assert self.process.stdout is not None
        self.process.stdout.close()


@contextmanager
def running_suite(data_dir: Path, **options: Any) -> Iterator[SuiteProcess]:
    """Start ``tutti up`` (see :class:`SuiteProcess`), yield it, always clean up."""
    suite = SuiteProcess(data_dir, **options)
    try:
        yield suite
    finally:
        suite.close()
