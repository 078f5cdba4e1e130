"""Token registry and principal rules (SEC-1)."""

from __future__ import annotations

import datetime
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


def _expiring(not_after: object, now: float) -> TokenRegistry:
    entry = {
        "subject": "temp",
        "role": "service",
        "workspaces": ["ws-1"],
        "sha256": token_digest("t-temp"),
        "not_after": not_after,
    }
    return TokenRegistry.from_entries([entry], clock=lambda: now)


# 2027-01-31T00:00:00Z
_EXPIRY = 1801353600.0


@pytest.mark.spec("SEC-3")
@pytest.mark.parametrize(
    "not_after",
    [
        "2027-01-31T00:00:00Z",
        "2027-01-31T01:00:00+01:00",
        1801353600,
        1801353600.0,
        datetime.datetime(2027, 1, 31, tzinfo=datetime.UTC),  # a YAML timestamp
    ],
    ids=["rfc3339-z", "rfc3339-offset", "unix-int", "unix-float", "yaml-timestamp"],
)
def test_a_token_past_its_not_after_is_expired(not_after: object) -> None:
    metadata = [("authorization", "Bearer t-temp")]
    valid = _expiring(not_after, now=_EXPIRY).authenticate(metadata)  # the last valid moment
    assert valid.not_after == _EXPIRY
    with pytest.raises(Unauthenticated) as raised:
        _expiring(not_after, now=_EXPIRY + 0.001).authenticate(metadata)
    assert raised.value.reason == "EXPIRED_CREDENTIALS"


@pytest.mark.spec("SEC-3")
def test_an_expiry_in_a_registry_file_is_read_and_enforced(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    digest = token_digest("t-old")
    path.write_text(
        "tokens:\n"
        f"  - {{subject: old, role: admin, workspaces: ['*'], sha256: '{digest}',"
        " not_after: 2020-01-01T00:00:00Z}\n"
        f"  - {{subject: new, role: admin, workspaces: ['*'], sha256: '{token_digest('t-new')}',"
        " not_after: 2999-01-01T00:00:00Z}\n"
    )
    registry = TokenRegistry.from_file(path)
    with pytest.raises(Unauthenticated) as raised:
        registry.authenticate([("authorization", "Bearer t-old")])
    assert raised.value.reason == "EXPIRED_CREDENTIALS"
    assert registry.authenticate([("authorization", "Bearer t-new")]).subject == "new"


@pytest.mark.spec("SEC-3")
@pytest.mark.parametrize(
    "not_after",
    ["tomorrow", "2027-01-31T00:00:00", datetime.date(2027, 1, 31), True, ["2027"]],
    ids=["words", "no-offset", "bare-date", "bool", "list"],
)
def test_a_malformed_not_after_names_the_entry(not_after: object) -> None:
    with pytest.raises(ValueError, match=r"tokens\[0\]: 'not_after'"):
        _expiring(not_after, now=0)


@pytest.mark.spec("SEC-1", "SEC-3")
def test_deployment_wide_is_declared_by_the_wildcard_alone() -> None:
    wide = Principal("ops", Role.ADMIN, frozenset({"*"}))
    assert (wide.deployment_wide, wide.scope) == (True, None)
    scoped = Principal("ws-ops", Role.ADMIN, frozenset({"ws-1", "ws-2"}))
    assert (scoped.deployment_wide, scoped.scope) == (False, frozenset({"ws-1", "ws-2"}))
    for workspaces in (["*", "ws-1"], ["ws-1", ""]):
        entry = {"role": "admin", "workspaces": workspaces, "sha256": token_digest("x")}
        with pytest.raises(ValueError, match=r"tokens\[0\]"):
            TokenRegistry.from_entries([entry])
