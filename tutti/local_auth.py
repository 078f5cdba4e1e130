"""The safe local default for authentication (SEC-1) used by ``tutti up``.

On first start a data directory gets a token registry holding only SHA-256 digests
(``auth/tokens.yaml``) and two random tokens, each readable only by the user:
``auth/cli-token`` (role admin, every workspace, for the CLI and grpcurl) and
``auth/service-token`` (role service, for service-to-service calls).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpcserver.auth import WILDCARD_WORKSPACE, Role, token_digest


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
