"""The running suite's record and how the CLI uses it (OPS-2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tutti.reference_commands import cli_settings
from tutti.suite_record import (
    find_running_suite,
    remove_suite_record,
    suite_record_path,
    write_suite_record,
)

ADDRESSES = {
    "host": "127.0.0.1:6001",
    "refresolve": "127.0.0.1:6002",
    "appcenter": "127.0.0.1:6005",
    "issuemanager": "127.0.0.1:6006",
}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh per-user location, and no TUTTI_* setting from the caller's environment."""
    for name in list(os.environ):
        if name.startswith("TUTTI_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def gone_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.spec("OPS-2")
def test_the_record_lives_at_a_fixed_per_user_location(home: Path) -> None:
    assert suite_record_path() == home / ".local" / "share" / "tutti" / "run" / "current-suite.json"


@pytest.mark.spec("OPS-2")
def test_a_written_record_is_found_and_removed_on_clean_stop(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert write_suite_record(data, ADDRESSES)
    path = suite_record_path()
    assert [p.name for p in path.parent.iterdir()] == ["current-suite.json"], "no temp file left"
    stored = json.loads(path.read_text())
    assert stored["pid"] == os.getpid()
    assert stored["dataDir"] == str(data.resolve())
    found = find_running_suite()
    assert found is not None
    assert found.data_dir == data.resolve()
    assert dict(found.addresses) == ADDRESSES
    assert remove_suite_record()
    assert not path.exists()
    assert find_running_suite() is None


@pytest.mark.spec("OPS-2")
def test_a_record_whose_process_is_gone_is_ignored_and_replaced(
    tmp_path: Path, gone_pid: int
) -> None:
    assert write_suite_record(tmp_path / "old", ADDRESSES, pid=gone_pid)
    assert find_running_suite() is None
    assert write_suite_record(tmp_path / "new", ADDRESSES)
    found = find_running_suite()
    assert found is not None
    assert found.data_dir == (tmp_path / "new").resolve()


@pytest.mark.spec("OPS-2")
def test_another_live_suite_keeps_its_record(tmp_path: Path) -> None:
    assert write_suite_record(tmp_path / "first", ADDRESSES)
    notes: list[str] = []
    other = os.getpid() + 1_000_000  # our own record is live; a second suite must not take it
    assert not write_suite_record(tmp_path / "second", ADDRESSES, pid=other, log=notes.append)
    assert notes
    assert "TUTTI_DATA_DIR=" in notes[0]
    assert "TUTTI_HOST_ADDRESS=127.0.0.1:6001" in notes[0]
    assert not remove_suite_record(pid=other), "a suite removes only its own record"
    found = find_running_suite()
    assert found is not None
    assert found.data_dir == (tmp_path / "first").resolve()


@pytest.mark.spec("OPS-2")
def test_a_malformed_record_is_ignored() -> None:
    path = suite_record_path()
    path.parent.mkdir(parents=True)
    for text in ("{", "[]", '{"pid": "1", "dataDir": "/x", "addresses": {}}', ""):
        path.write_text(text)
        assert find_running_suite() is None


@pytest.mark.spec("OPS-1", "OPS-2")
def test_the_cli_uses_the_running_suite_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "suite-data"
    assert cli_settings().host_address == "127.0.0.1:50051", "no suite: the defaults"
    write_suite_record(data, ADDRESSES)

    found = cli_settings()
    assert found.data_dir == data.resolve()
    assert found.host_address == "127.0.0.1:6001"
    assert found.refresolve_address == "127.0.0.1:6002"
    assert found.appcenter_address == "127.0.0.1:6005"
    assert found.issuemanager_address == "127.0.0.1:6006"

    monkeypatch.setenv("TUTTI_HOST_ADDRESS", "127.0.0.1:7001")
    explicit_address = cli_settings()
    assert explicit_address.host_address == "127.0.0.1:7001", "an explicit address wins"
    assert explicit_address.data_dir == data.resolve()
    assert explicit_address.refresolve_address == "127.0.0.1:6002"

    monkeypatch.delenv("TUTTI_HOST_ADDRESS")
    monkeypatch.setenv("TUTTI_DATA_DIR", str(data))
    same_dir = cli_settings()
    assert same_dir.host_address == "127.0.0.1:6001", "the same data dir: the suite's addresses"

    monkeypatch.setenv("TUTTI_DATA_DIR", str(tmp_path / "elsewhere"))
    other_dir = cli_settings()
    assert other_dir.data_dir == tmp_path / "elsewhere", "an explicit data dir wins"
    assert other_dir.host_address == "127.0.0.1:50051", "and the record (another suite) is unused"
