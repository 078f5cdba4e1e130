"""The safe local default for authentication (SEC-1) used by ``tutti up``.

On first start a data directory gets a token registry holding only SHA-256 digests
(``auth/tokens.yaml``) and two random tokens, each readable only by the user:
``auth/cli-token`` (role admin, every workspace, for the CLI and grpcurl) and
``auth/service-token`` (role service, for service-to-service calls).

:func:`ensure_principal_tokens` adds one random token per named principal (the contract
fixtures' ``principals.yaml``) to that registry, so ``tutti conformance run`` can replay
the fixtures against a ``tutti up`` on the same data directory.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from grpcserver.auth import WILDCARD_WORKSPACE, Role, parse_not_after, token_digest


@dataclass(frozen=True)
class LocalCredentials:
    """Paths and values of the local tokens."""

    tokens_file: Path
    cli_token: str
    service_token: str


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def ensure_local_credentials(data_dir: Path) -> LocalCredentials:
    """Create the local token registry once; later calls return the existing tokens."""
    auth_dir = data_dir / "auth"
    tokens_file = auth_dir / "tokens.yaml"
    cli_path, service_path = auth_dir / "cli-token", auth_dir / "service-token"
    if not (tokens_file.exists() and cli_path.exists() and service_path.exists()):
        auth_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(auth_dir, 0o700)
        cli_token, service_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        registry = {
            "tokens": [
                {
                    "subject": "local-cli",
                    "role": Role.ADMIN.value,
                    "workspaces": [WILDCARD_WORKSPACE],
                    "sha256": token_digest(cli_token),
                },
                {
                    "subject": "local-services",
                    "role": Role.SERVICE.value,
                    "workspaces": [WILDCARD_WORKSPACE],
                    "sha256": token_digest(service_token),
                },
            ]
        }
        _write_private(cli_path, cli_token + "\n")
        _write_private(service_path, service_token + "\n")
        _write_private(tokens_file, yaml.safe_dump(registry, sort_keys=False))
    return LocalCredentials(
        tokens_file=tokens_file,
        cli_token=cli_path.read_text(encoding="utf-8").strip(),
        service_token=service_path.read_text(encoding="utf-8").strip(),
    )


PRINCIPAL_SUBJECT_PREFIX = "principal:"
"""Registry subjects of the tokens :func:`ensure_principal_tokens` adds."""


def ensure_principal_tokens(
    data_dir: Path, principals: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """Give each principal a token in the data directory's registry; return name -> token.

    ``principals`` maps a name to its ``role``, ``workspaces`` and optional ``not_after``
    (the shape of the fixtures' ``principals.yaml``; an expiry is copied as it is). The
    local credentials are created first if missing (so ``tutti up`` keeps the registry),
    a principal keeps its token across calls (``auth/principal-tokens.yaml``, mode 0600),
    and the registry's principal entries are replaced by exactly these. Servers read the
    registry when they start.

    Raises:
        ValueError: A principal has an unknown role, no list of workspaces or a bad expiry.
    """
    entries = []
    for name, spec in principals.items():
        role, workspaces = spec.get("role"), spec.get("workspaces")
        if role not in {member.value for member in Role}:
            raise ValueError(f"principal {name!r}: unknown role {role!r}")
        if not isinstance(workspaces, list) or not all(isinstance(w, str) for w in workspaces):
            raise ValueError(f"principal {name!r}: workspaces must be a list of strings")
        not_after = spec.get("not_after")
        if not_after is not None:
            parse_not_after(not_after, where=f"principal {name!r}")
        entries.append((name, role, workspaces, not_after))
    credentials = ensure_local_credentials(data_dir)
    tokens_path = credentials.tokens_file.parent / "principal-tokens.yaml"
    try:
        known = yaml.safe_load(tokens_path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        known = {}
    tokens = {
        name: str(known[name]) if isinstance(known, dict) and known.get(name) else None
        for name, *_ in entries
    }
    issued = {name: token or secrets.token_urlsafe(32) for name, token in tokens.items()}
    registry = yaml.safe_load(credentials.tokens_file.read_text(encoding="utf-8")) or {}
    kept = [
        entry
        for entry in registry.get("tokens") or []
        if not str(entry.get("subject", "")).startswith(PRINCIPAL_SUBJECT_PREFIX)
    ]
    added = [
        {
            "subject": f"{PRINCIPAL_SUBJECT_PREFIX}{name}",
            "role": role,
            "workspaces": workspaces,
            "sha256": token_digest(issued[name]),
            **({} if not_after is None else {"not_after": not_after}),
        }
        for name, role, workspaces, not_after in entries
    ]
    _write_private(tokens_path, yaml.safe_dump(issued, sort_keys=False))
    _write_private(
        credentials.tokens_file, yaml.safe_dump({"tokens": kept + added}, sort_keys=False)
    )
    return issued
