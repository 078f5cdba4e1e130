"""``tutti conformance run`` checks any implementation from the data fixtures (CON-3)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.servers import TEST_PRINCIPALS, LiveServer, token_for

FIXTURES = Path(__file__).parent / "fixtures"


def _run(fixtures: Path, server: LiveServer) -> subprocess.CompletedProcess[str]:
    tokens = [f"--token={name}={token_for(name)}" for name in TEST_PRINCIPALS]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tutti",
            "conformance",
            "run",
            str(fixtures),
            f"--address={server.name}={server.address}",
            *tokens,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.spec("CON-3")
def test_cli_passes_a_conforming_server(live_server: Callable[..., LiveServer]) -> None:
    server = live_server("refresolve")
    result = _run(FIXTURES / "refresolve", server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "steps, ok" in result.stdout


@pytest.mark.spec("CON-3")
def test_cli_fails_on_a_mismatch(live_server: Callable[..., LiveServer], tmp_path: Path) -> None:
    server = live_server("refresolve")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        "service: agentactivity.refresolve.v1.ReferenceService\n"
        "server: refresolve\n"
        "cases:\n"
        "  - name: claims the RPC works\n"
        "    steps:\n"
        "      - method: ListReferences\n"
        "        principal: ws1-device\n"
        "        request: {workspaceId: ws-1, source: REFERENCE_SOURCE_APP, id: a}\n"
        "        response: {}\n"
    )
    result = _run(wrong, server)
    assert result.returncode == 1
    assert "unexpected UNIMPLEMENTED" in result.stdout
