"""Domain types of reference resolution (REF-API-1): handles, requests, items, results."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "ReferenceHandle",
    "ReferenceItem",
    "Resolution",
    "ResolveRequest",
    "Source",
]

DEFAULT_LIMIT = 1000
"""Result size when the caller gives none (SPEC section 9)."""

MAX_LIMIT = 1000
"""Largest result size; larger limits are clamped to it."""


class Source(enum.StrEnum):
    """The container kind a handle names; the value is the mention's ``source``."""

    APP = "app"
    TASK = "task"


@dataclass(frozen=True)
class ReferenceHandle:
    """The machine-readable content of a workspace-reference mention (REF-URI-1).

    Attributes:
        source: app or task.
        id: app id (app) or topic id (task).
        workspace_id: the mention's workspace scope.
        group_id: app-owned group (app) or issue id (task); ``None`` for the whole container.
    """

    source: Source
    id: str
    workspace_id: str
    group_id: str | None = None


@dataclass(frozen=True)
class ReferenceItem:
    """One resolved artifact file (the CLI JSON item of REF-CLI-1)."""

    path: str
    display_name: str
    size_bytes: int
    media_type: str
    created_at_unix_ms: int


@dataclass(frozen=True)
class ResolveRequest:
    """A handle to resolve with its filter and limit (``limit`` ``None`` or 0: default)."""

    workspace_id: str
    source: Source | None
    id: str
    group_id: str | None = None
    query: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Resolution:
    """A resolved, de-duplicated, filtered and truncated file list."""

    items: tuple[ReferenceItem, ...]
    truncated: bool
