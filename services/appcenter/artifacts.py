"""Domain types of the store-backed AppCenter backend (REF-BACKEND-1, REF-APP-1).

An app owns a tree of artifact groups and artifacts. Group ids are unique within their
app and artifact paths within their container; the store's keys are workspace-wide, so
rows carry derived keys (:func:`group_key`, :func:`artifact_key`) that embed the app
(and container), and the listing maps them back to the contract's ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

__all__ = [
    "AppTree",
    "Artifact",
    "GroupEntry",
    "GroupTree",
    "LoadCounts",
    "ReferencePage",
    "artifact_key",
    "group_id_of",
    "group_key",
]


@dataclass(frozen=True)
class Artifact:
    """One file of an app container (the listing item and the load shape)."""

    path: str
    display_name: str
    size_bytes: int
    media_type: str
    created_at_unix_ms: int


@dataclass(frozen=True)
class GroupTree:
    """A group with its whole subtree, as loaded."""

    group_id: str
    display_name: str
    groups: tuple[GroupTree, ...]
    artifacts: tuple[Artifact, ...]


@dataclass(frozen=True)
class AppTree:
    """An app with its whole artifact tree, as loaded."""

    app_id: str
    display_name: str
    groups: tuple[GroupTree, ...]
    artifacts: tuple[Artifact, ...]


@dataclass(frozen=True)
class GroupEntry:
    """A child group in a listing page."""

    group_id: str
    display_name: str


@dataclass(frozen=True)
class ReferencePage:
    """One page of a container's direct children (groups first, then files)."""

    groups: tuple[GroupEntry, ...]
    files: tuple[Artifact, ...]
    next_page_token: str


@dataclass(frozen=True)
class LoadCounts:
    """What one load wrote."""

    apps: int
    groups: int
    artifacts: int


def group_key(app_id: str, group_id: str) -> str:
    """The stored ``group_id`` of an app's group: unique per workspace, ordered like ``group_id``.

    The length prefix makes the key unambiguous; within one app the prefix is constant,
    so ordering keys orders the contract's group ids.
    """
    return f"{len(app_id)}:{app_id}/{group_id}"


def group_id_of(app_id: str, key: str) -> str:
    """Invert :func:`group_key` for a key of ``app_id``."""
    return key[len(group_key(app_id, "")) :]


def artifact_key(app_id: str, group_id: str | None, path: str) -> str:
    """The stored ``artifact_id``: a digest of (app, container, path), unique per workspace."""
    canonical = json.dumps([app_id, group_id, path], ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
