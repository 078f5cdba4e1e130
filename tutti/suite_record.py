"""The record of the running local suite, so the CLI finds what ``tutti up`` started.

``tutti up`` writes ``<default data dir>/run/current-suite.json`` (a fixed per-user
location, see :func:`grpcserver.settings.default_data_dir`) once every service is
SERVING, and removes it when it stops cleanly. The record names the supervisor's pid,
the suite's data directory and each server's address::

    {"pid": 4242, "dataDir": "/work/app/.data", "startedAtUnixMs": 1700000000000,
     "pidStart": "91234", "addresses": {"host": "127.0.0.1:50051", ...}}

CLI commands given no explicit data directory or address use it (explicit settings
always win; see :func:`tutti.reference_commands.cli_settings`), so ``tutti up --data-dir
.data`` and a plain ``tutti session create`` meet. A record whose process is gone (a
supervisor killed with ``kill -9`` cannot remove it) is ignored and replaced. While
another live suite holds the record, a second ``tutti up`` leaves it alone and says so:
the CLI keeps talking to the first suite unless told otherwise. The record holds no
credential (the token stays in the data directory).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpcserver.settings import default_data_dir

__all__ = [
    "SuiteRecord",
    "find_running_suite",
    "remove_suite_record",
    "suite_record_path",
    "write_suite_record",
]


@dataclass(frozen=True)
class SuiteRecord:
    """One running ``tutti up``."""

    pid: int
    """Process id of the supervisor."""

    data_dir: Path
    """Absolute data directory of the suite (token, workspace, SQLite store)."""

    addresses: Mapping[str, str]
    """``host:port`` of each server by name (``host``, ``refresolve`` ...)."""

    started_at_unix_ms: int
    """When the suite reported ready."""

    pid_start: str | None = None
    """Start time of ``pid`` (Linux clock ticks since boot), so a reused pid is not taken
    for the suite; ``None`` where unknown."""

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object stored on disk."""
        return {
            "pid": self.pid,
            "dataDir": str(self.data_dir),
            "startedAtUnixMs": self.started_at_unix_ms,
            "addresses": dict(self.addresses),
            "pidStart": self.pid_start,
        }

    @classmethod
    def from_json(cls, document: object) -> SuiteRecord | None:
        """Parse a stored record; ``None`` when it is not one."""
        if not isinstance(document, dict):
            return None
        pid, data_dir = document.get("pid"), document.get("dataDir")
        addresses = document.get("addresses")
        started = document.get("startedAtUnixMs", 0)
        pid_start = document.get("pidStart")
        if (
            not isinstance(pid, int)
            or isinstance(pid, bool)
            or pid <= 0
            or not isinstance(data_dir, str)
            or not isinstance(addresses, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in addresses.items())
            or not isinstance(started, int)
            or not isinstance(pid_start, str | None)
        ):
            return None
        return cls(
            pid=pid,
            data_dir=Path(data_dir),
            addresses=addresses,
            started_at_unix_ms=started,
            pid_start=pid_start,
        )


def suite_record_path() -> Path:
    """Where the record lives: ``<default data dir>/run/current-suite.json``.

    The location is per user and does not follow ``TUTTI_DATA_DIR``: it is how a CLI
    that knows no data directory finds one.
    """
    return default_data_dir() / "run" / "current-suite.json"


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), ``None`` if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of proc_pid_stat(5)


def _alive(record: SuiteRecord) -> bool:
    """Whether the record's supervisor still runs (a reused pid does not count)."""
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if record.pid_start is None:
        return True
    return _process_start(record.pid) in (record.pid_start, None)


def _read(path: Path) -> SuiteRecord | None:
    try:
        return SuiteRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def find_running_suite(path: Path | None = None) -> SuiteRecord | None:
    """Return the recorded suite if its supervisor still runs, else ``None``.

    Args:
        path: The record file; default :func:`suite_record_path`.
    """
    record = _read(path or suite_record_path())
    if record is None or not _alive(record):
        return None
    return record


def write_suite_record(
    data_dir: Path,
    addresses: Mapping[str, str],
    *,
    log: Callable[[str], None] | None = None,
    pid: int | None = None,
    path: Path | None = None,
) -> bool:
    """Record this suite for the CLI, atomically; keep another live suite's record.

    Args:
        data_dir: The suite's data directory (stored resolved).
        addresses: ``{server name: host:port}`` as the suite reported them.
        log: Where to say that another live suite keeps the record.
        pid: The supervisor's pid; default this process.
        path: The record file; default :func:`suite_record_path`.

    Returns:
        True when the record now names this suite.
    """
    path = path or suite_record_path()
    pid = os.getpid() if pid is None else pid
    current = find_running_suite(path)
    if current is not None and current.pid != pid:
        if log is not None:
            log(
                f"note: the CLI's default suite stays pid {current.pid} ({current.data_dir}); "
                f"for this one set TUTTI_DATA_DIR={data_dir.resolve()} and "
                f"TUTTI_HOST_ADDRESS={addresses.get('host', '')}"
            )
        return False
    record = SuiteRecord(
        pid=pid,
        data_dir=data_dir.resolve(),
        addresses=dict(addresses),
        started_at_unix_ms=int(time.time() * 1000),
        pid_start=_process_start(pid),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{pid}.tmp")
    tmp.write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return True


def remove_suite_record(*, pid: int | None = None, path: Path | None = None) -> bool:
    """Remove the record if it names this suite (another suite's record stays).

    Args:
        pid: The supervisor's pid; default this process.
        path: The record file; default :func:`suite_record_path`.

    Returns:
        True when a record was removed.
    """
    path = path or suite_record_path()
    pid = os.getpid() if pid is None else pid
    record = _read(path)
    if record is None or record.pid != pid:
        return False
    path.unlink(missing_ok=True)
    return True
