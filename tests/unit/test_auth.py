"""Token registry and principal rules (SEC-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from domainerrors import InvalidArgument, PermissionDenied, Unauthenticated
from grpcserver.auth import Principal, Role, TokenRegistry, token_digest


def _registry() -> TokenRegistry:
    return TokenRegistry.from_entries(
        [
            {
                "subject": "phone",
                "role": "device",
                "workspaces": ["ws-1"],
                "sha256": token_digest("t-phone"),
            },
            {
                "subject": "ops",
                "role": "admin",
                "workspaces": ["*"],
                "sha256": token_digest("t-ops"),
            },
        ]
    )


@pytest.mark.spec("SEC-1")
def test_bearer_token_maps_to_its_principal() -> None:
    principal = _registry().authenticate([("authorization", "Bearer t-phone")])
    assert principal == Principal("phone", Role.DEVICE, frozenset({"ws-1"}))


@pytest.mark.spec("SEC-1")
@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], "MISSING_CREDENTIALS"),
        ([("authorization", "Basic t-phone")], "MALFORMED_CREDENTIALS"),
        ([("authorization", "Bearer ")], "MALFORMED_CREDENTIALS"),
        ([("authorization", "Bearer nope")], "INVALID_CREDENTIALS"),
    ],
)
def test_bad_credentials_are_unauthenticated(metadata: list[tuple[str, str]], reason: str) -> None:
    with pytest.raises(Unauthenticated) as raised:
        _registry().authenticate(metadata)
    assert raised.value.reason == reason


@pytest.mark.spec("SEC-1")
def test_workspace_scope() -> None:
    phone = _registry().authenticate([("authorization", "Bearer t-phone")])
    phone.require_workspace("ws-1")
    with pytest.raises(PermissionDenied) as raised:
        phone.require_workspace("ws-2")
    assert raised.value.reason == "WORKSPACE_SCOPE_MISMATCH"
    with pytest.raises(InvalidArgument):
        phone.require_workspace("")
    ops = _registry().authenticate([("authorization", "Bearer t-ops")])
    ops.require_workspace("any-workspace")


@pytest.mark.spec("SEC-1")
def test_registry_file_rejects_malformed_entries(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        "tokens:\n  - {subject: x, role: king, workspaces: [a], sha256: '" + "0" * 64 + "'}\n"
    )
    with pytest.raises(ValueError, match="role"):
        TokenRegistry.from_file(path)
    path.write_text("tokens:\n  - {subject: x, role: device, workspaces: [a], sha256: short}\n")
    with pytest.raises(ValueError, match="sha256"):
        TokenRegistry.from_file(path)
    path.write_text(
        "tokens:\n  - {subject: x, role: device, workspaces: a, sha256: '" + "0" * 64 + "'}\n"
    )
    with pytest.raises(ValueError, match="workspaces"):
        TokenRegistry.from_file(path)


@pytest.mark.spec("SEC-1")
def test_registry_stores_no_plain_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(
        '{"tokens": [{"subject": "s", "role": "service", "workspaces": ["*"], "sha256": "'
        + token_digest("svc")
        + '"}]}'
    )
    registry = TokenRegistry.from_file(path)
    assert registry.authenticate([("authorization", "Bearer svc")]).role is Role.SERVICE
    assert "svc" not in path.read_text().replace(token_digest("svc"), "")
