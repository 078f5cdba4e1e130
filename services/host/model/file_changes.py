"""A Turn's file-change snapshot (HOST-TURN-8): its value, its rules and its stored JSON.

The runtime reports the snapshot on its Turn patches; Host validates it, stores it verbatim in
``turns.file_changes_json`` until the Turn settles, and never derives it from tool-call messages.
The stored text is a JSON list of ``{"path", "change", "previous_path"?}`` objects, one per path,
in the runtime's order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FILE_CHANGE_KINDS",
    "MAX_FILE_CHANGES",
    "MAX_FILE_PATH_CHARS",
    "FileChange",
    "decode_file_changes",
    "encode_file_changes",
    "file_changes_violation",
]

FILE_CHANGE_KINDS = ("created", "modified", "deleted", "renamed")
"""The defined change kinds, as stored."""
MAX_FILE_CHANGES = 2000
"""Most entries one snapshot may hold."""
MAX_FILE_PATH_CHARS = 4096
"""Longest path (and previous path) in characters: Linux's ``PATH_MAX``."""


@dataclass(frozen=True)
class FileChange:
    """One entry: what a Turn did to ``path``.

    Attributes:
        path: the file's workspace-relative path.
        change: one of :data:`FILE_CHANGE_KINDS`; ``None`` when the wire could not map it.
        previous_path: the old path of a ``renamed`` file (only then).
    """

    path: str
    change: str | None
    previous_path: str | None = None


def _path_problem(path: str) -> str | None:
    if not path.strip():
        return "must not be empty"
    if len(path) > MAX_FILE_PATH_CHARS:
        return f"must be at most {MAX_FILE_PATH_CHARS} characters"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return "must not contain control characters"
    return None


def file_changes_violation(changes: Sequence[FileChange]) -> str | None:
    """The first problem of a reported snapshot, or ``None`` when it is valid.

    A valid snapshot has at most :data:`MAX_FILE_CHANGES` entries, one per path; each has a
    non-empty bounded path without control characters and a defined change kind, and
    ``previous_path`` is set exactly for ``renamed`` (and differs from ``path``).
    """
    if len(changes) > MAX_FILE_CHANGES:
        return f"file_changes holds more than {MAX_FILE_CHANGES} entries"
    seen: set[str] = set()
    for at, entry in enumerate(changes):
        where = f"file_changes[{at}]"
        if (problem := _path_problem(entry.path)) is not None:
            return f"{where}.path {problem}"
        if entry.change not in FILE_CHANGE_KINDS:
            return f"{where}.change must be created, modified, deleted or renamed"
        if entry.change == "renamed":
            if entry.previous_path is None:
                return f"{where}.previous_path is required for a renamed file"
            if (problem := _path_problem(entry.previous_path)) is not None:
                return f"{where}.previous_path {problem}"
            if entry.previous_path == entry.path:
                return f"{where}.previous_path must differ from path"
        elif entry.previous_path is not None:
            return f"{where}.previous_path is only allowed for a renamed file"
        if entry.path in seen:
            return f"{where}.path {entry.path!r} appears more than once"
        seen.add(entry.path)
    return None


def encode_file_changes(changes: Sequence[FileChange]) -> str:
    """The ``turns.file_changes_json`` text of a validated snapshot."""
    items: list[dict[str, str]] = []
    for entry in changes:
        item = {"path": entry.path, "change": entry.change or ""}
        if entry.previous_path is not None:
            item["previous_path"] = entry.previous_path
        items.append(item)
    return json.dumps(items, ensure_ascii=False, separators=(",", ":"))


def decode_file_changes(text: str | None) -> tuple[FileChange, ...]:
    """Parse a stored snapshot leniently: ``NULL`` or malformed text reads as no changes."""
    if not text:
        return ()
    try:
        value: Any = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(value, list):
        return ()
    entries = []
    for item in value:
        if not isinstance(item, dict):
            continue
        path, change = item.get("path"), item.get("change")
        if not isinstance(path, str) or change not in FILE_CHANGE_KINDS:
            continue
        previous = item.get("previous_path")
        entries.append(FileChange(path, change, previous if isinstance(previous, str) else None))
    return tuple(entries)
