"""Workspace ids as NATS subject tokens (one subject per workspace, SCALE-3)."""

from __future__ import annotations

import string

from livelog.interface import InvalidWorkspace

__all__ = ["workspace_subject", "workspace_token"]

# Characters NATS recommends in subject tokens. Everything else (``.``, ``*``, ``>``,
# whitespace, non-ASCII, and the escape character itself) is written as ``~HH`` per UTF-8
# byte, so the mapping is injective and a readable id stays readable.
_PLAIN = frozenset(string.ascii_letters + string.digits + "-_")


def workspace_token(workspace_id: str) -> str:
    """The subject token of a workspace id (injective).

    Raises:
        InvalidWorkspace: the id is empty.
    """
    if not workspace_id:
        raise InvalidWorkspace("the workspace id is empty")
    if all(char in _PLAIN for char in workspace_id):
        return workspace_id
    parts: list[str] = []
    for char in workspace_id:
        if char in _PLAIN:
            parts.append(char)
        else:
            parts.extend(f"~{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(parts)


def workspace_subject(prefix: str, workspace_id: str) -> str:
    """The subject of a workspace's items: ``<prefix>.<token>``."""
    return f"{prefix}.{workspace_token(workspace_id)}"
