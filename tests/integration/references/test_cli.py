"""``tutti refdata load`` and ``tutti reference list`` as subprocesses against live servers.

(REF-CLI-1, REF-BACKEND-1, OPS-2)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.references import ReferenceSuite

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "refdata.yaml"


def _tutti(
    suite: ReferenceSuite, data_dir: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TUTTI_")}
    environment.update(
        TUTTI_DATA_DIR=str(data_dir),
        TUTTI_APPCENTER_ADDRESS=suite.appcenter.address,
        TUTTI_ISSUEMANAGER_ADDRESS=suite.issuemanager.address,
        TUTTI_REFRESOLVE_ADDRESS=suite.refresolve.address,
        **env,
    )
    return subprocess.run(
        [sys.executable, "-m", "tutti", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment,
        cwd=ROOT,
    )


@pytest.mark.spec("REF-CLI-1", "REF-BACKEND-1", "OPS-2")
def test_load_the_example_then_list_references_as_json(
    reference_suite: ReferenceSuite, tmp_path: Path
) -> None:
    auth = tmp_path / "auth"
    auth.mkdir()
    (auth / "cli-token").write_text("token-admin\n")  # the local admin token, as `tutti up` writes
    loaded = _tutti(reference_suite, tmp_path, "refdata", "load", str(EXAMPLE))
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == (
        "ws-1: 1 apps (3 groups, 6 artifacts), 1 topics (2 issues, 3 outputs)"
    )
    again = _tutti(reference_suite, tmp_path, "refdata", "load", str(EXAMPLE))
    assert again.stdout == loaded.stdout, "loading twice is idempotent"

    listed = _tutti(
        reference_suite,
        tmp_path,
        "reference",
        "list",
        "--source",
        "app",
        "--id",
        "reports",
        "--json",
        TUTTI_WORKSPACE="ws-1",
    )
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert list(document) == ["items"]
    assert listed.stdout.startswith('{"items":[{"path":'), "exactly the REF-CLI-1 shape"
    assert [item["path"] for item in document["items"]] == [
        "/apps/reports/README.md",
        "/apps/reports/q1/revenue.csv",
        "/apps/reports/q1/summary.md",
        "/apps/reports/q1/charts/revenue.png",
        "/apps/reports/q2/summary.md",
    ]
    first = document["items"][2]
    assert first == {
        "path": "/apps/reports/q1/summary.md",
        "displayName": "summary.md",
        "sizeBytes": 2048,
        "mediaType": "text/markdown",
        "createdAtUnixMs": 1780000000000,
    }
    assert all(
        list(item) == ["path", "displayName", "sizeBytes", "mediaType", "createdAtUnixMs"]
        for item in document["items"]
    )
    assert all(isinstance(item["sizeBytes"], int) for item in document["items"])

    (auth / "workspace").write_text("ws-1\n")  # the workspace entry next to the token
    task = _tutti(
        reference_suite,
        tmp_path,
        "reference",
        "list",
        "--source",
        "task",
        "--id",
        "launch",
        "--group-id",
        "launch-1",
        "--json",
    )
    assert task.returncode == 0, task.stderr
    assert json.loads(task.stdout)["items"][0]["sizeBytes"] == 730
    filtered = _tutti(
        reference_suite,
        tmp_path,
        "reference",
        "list",
        "--source=task",
        "--id=launch",
        "--query=PNG",
        "--limit=5",
        "--json",
    )
    assert [i["path"] for i in json.loads(filtered.stdout)["items"]] == ["/tasks/launch-2/home.png"]


@pytest.mark.spec("REF-CLI-1")
def test_failures_print_one_line_and_exit_non_zero(
    reference_suite: ReferenceSuite, tmp_path: Path
) -> None:
    missing = _tutti(
        reference_suite,
        tmp_path,
        "reference",
        "list",
        "--source=app",
        "--id=nope",
        "--json",
        "--workspace=ws-1",
        TUTTI_CLI_TOKEN="token-ws1-device",
    )
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("error: NOT_FOUND (APP_NOT_FOUND): ")
    foreign = _tutti(
        reference_suite,
        tmp_path,
        "reference",
        "list",
        "--source=app",
        "--id=x",
        "--workspace=ws-2",
        "--token=token-ws1-device",
    )
    assert foreign.returncode == 1
    assert foreign.stderr.startswith("error: PERMISSION_DENIED (WORKSPACE_SCOPE_MISMATCH)")
    no_token = _tutti(
        reference_suite, tmp_path, "reference", "list", "--source=app", "--id=x", "--workspace=w"
    )
    assert no_token.returncode == 2
    assert no_token.stderr.startswith("error: no CLI token")
    no_workspace = _tutti(
        reference_suite, tmp_path, "reference", "list", "--source=app", "--id=x", "--token=t"
    )
    assert no_workspace.returncode == 2
    assert no_workspace.stderr.startswith("error: no workspace")
    bad_source = _tutti(
        reference_suite, tmp_path, "reference", "list", "--source=file", "--id=x", "--token=t"
    )
    assert bad_source.returncode == 2
    assert bad_source.stderr.count("\n") == 1
    device_load = _tutti(
        reference_suite,
        tmp_path,
        "refdata",
        "load",
        str(EXAMPLE),
        TUTTI_CLI_TOKEN="token-ws1-device",
    )
    assert device_load.returncode == 1
    assert device_load.stderr.startswith("error: PERMISSION_DENIED (ROLE_NOT_ALLOWED)")
    broken = tmp_path / "broken.json"
    broken.write_text('{"workspaceId": "ws-1", "apps": [{"appId": "a", "bogus": 1}]}')
    bad_file = _tutti(
        reference_suite, tmp_path, "refdata", "load", str(broken), TUTTI_CLI_TOKEN="token-admin"
    )
    assert bad_file.returncode == 1
    assert bad_file.stderr.count("\n") == 1
    assert "bogus" in bad_file.stderr
