"""``tutti conformance run`` checks any implementation from the data fixtures (CON-3)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.servers import TEST_PRINCIPALS, LiveServer, token_for

FIXTURES = Path(__file__).parent / "fixtures"


def _run(fixtures: Path, *servers: LiveServer) -> subprocess.CompletedProcess[str]:
    tokens = [f"--token={name}={token_for(name)}" for name in TEST_PRINCIPALS]
    addresses = [f"--address={server.name}={server.address}" for server in servers]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tutti",
            "conformance",
            "run",
            str(fixtures),
            *addresses,
            *tokens,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.spec("CON-3")
def test_cli_passes_a_conforming_server(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    # refresolve's fixtures load data into its backends, so all three are addressed.
    appcenter = live_server("appcenter", database_url=migrated_db_url)
    issuemanager = live_server("issuemanager", database_url=migrated_db_url)
    server = live_server(
        "refresolve",
        appcenter_address=appcenter.address,
        issuemanager_address=issuemanager.address,
        service_token=token_for("service"),
    )
    result = _run(FIXTURES / "refresolve", server, appcenter, issuemanager)
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
        "      - method: GetReferenceSkill\n"
        "        principal: ws1-device\n"
        "        request: {workspaceId: ws-1}\n"
        "        response: {}\n"
    )
    result = _run(wrong, server)
    assert result.returncode == 1
    assert "1 FAILED" in result.stdout
    assert "expected {}, got" in result.stdout
