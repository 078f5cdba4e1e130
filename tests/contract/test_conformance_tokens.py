"""Tokens for the fixture principals: a clear error without them, a way to make them (CON-3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from conformance.runner import MissingTokenError, load_fixtures, replay
from domainerrors import Unauthenticated
from grpcserver.auth import TokenRegistry
from tutti.local_auth import ensure_local_credentials

FIXTURES = Path(__file__).parent / "fixtures"
PRINCIPALS = FIXTURES / "principals.yaml"
RETENTION = FIXTURES / "maintenance" / "retention.yaml"
"""One fixture file whose principals are admin and two devices."""


def _tutti(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tutti", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.spec("CON-3", "OPS-2")
def test_a_missing_token_is_one_line_naming_the_principals() -> None:
    result = _tutti(
        "conformance",
        "run",
        str(RETENTION),
        "--address",
        "maintenance=127.0.0.1:1",  # never dialled: the tokens are checked first
        "--token",
        "admin=some-token",
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: no --token for principal(s) ws1-device, ws2-device:")
    assert "--token NAME=TOKEN" in result.stderr


@pytest.mark.spec("CON-3")
def test_replay_refuses_before_any_step_without_a_token() -> None:
    (fixture,) = load_fixtures([RETENTION])
    assert fixture.principals == {"admin", "ws1-device", "ws2-device"}
    with grpc.insecure_channel("127.0.0.1:1") as channel, pytest.raises(MissingTokenError) as err:
        replay(fixture, channel, {"admin": "x"})
    assert err.value.principals == ["ws1-device", "ws2-device"]


@pytest.mark.spec("CON-3", "OPS-2", "SEC-1", "SEC-3")
def test_provision_gives_every_principal_a_token_tutti_up_keeps(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = _tutti("conformance", "provision", str(PRINCIPALS), "--data-dir", str(data))
    assert first.returncode == 0, first.stderr
    arguments = first.stdout.split()
    expected = yaml.safe_load(PRINCIPALS.read_text())["principals"]
    tokens = dict(arg.removeprefix("--token=").split("=", 1) for arg in arguments)
    assert list(tokens) == list(expected)
    assert all(arg.startswith("--token=") for arg in arguments)
    assert "tutti up --data-dir" in first.stderr

    # What `tutti up --data-dir DIR` does first keeps the registry, and its servers accept
    # each token as exactly the declared principal.
    credentials = ensure_local_credentials(data)
    registry = TokenRegistry.from_file(credentials.tokens_file)
    for name, token in tokens.items():
        if "not_after" in expected[name]:  # an expired principal stays expired (SEC-3)
            with pytest.raises(Unauthenticated) as expired:
                registry.authenticate([("authorization", f"Bearer {token}")])
            assert expired.value.reason == "EXPIRED_CREDENTIALS"
            continue
        principal = registry.authenticate([("authorization", f"Bearer {token}")])
        assert principal.role.value == expected[name]["role"]
        assert principal.workspaces == frozenset(expected[name]["workspaces"])
    local = registry.authenticate([("authorization", f"Bearer {credentials.cli_token}")])
    assert local.subject == "local-cli", "the local CLI token stays valid"
    assert (data / "auth" / "principal-tokens.yaml").stat().st_mode & 0o077 == 0

    again = _tutti("conformance", "provision", str(PRINCIPALS), "--data-dir", str(data))
    assert again.stdout == first.stdout, "a principal keeps its token"
    entries = yaml.safe_load(credentials.tokens_file.read_text())["tokens"]
    assert len(entries) == 2 + len(expected), "no duplicate entries"


@pytest.mark.spec("CON-3", "OPS-2")
def test_provision_refuses_a_malformed_principals_file(tmp_path: Path) -> None:
    bad = tmp_path / "principals.yaml"
    bad.write_text("principals:\n  odd: {role: root, workspaces: ['*']}\n")
    result = _tutti("conformance", "provision", str(bad), "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}: principal 'odd': unknown role 'root'"
