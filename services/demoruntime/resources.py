"""The per-Session resources the demo agent creates when a Turn starts (MAINT-OUT-1).

A real provider runtime keeps state beside the canonical store: a sidecar state directory and
copied attachments keyed by Session id, a per-workspace scratch directory, and a lease held by a
global Agent/browser releaser. The demo writes a small JSON file into each, at the places
:class:`session_resources.ResourceLayout` names, so the maintenance service has real resources to
release after Host purges the Session:

* ``sidecar_dir(session)/state.json`` — the last started Turn;
* ``attachments_dir(session)/<sha256 of the reference id>.json`` — one per reference of the
  Turn, its metadata (the demo's "copied attachment"; the id is hashed because references keep
  their ids verbatim, and a file name must be one safe path component);
* ``workspace_dir(workspace, session)/scratch.json``;
* ``agent_lease(session)/lease.json``.

Nothing here deletes: a deleted (tombstoned) Session keeps its resources, since it can be
restored; releasing them is maintenance's job after the purge. The Session's ``cwd`` (a managed
worktree when isolated) is only recorded, never written to.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from agentactivity.host.v1 import runtime_pb2
from session_resources import ResourceLayout

__all__ = ["attachment_file_name", "write_turn_resources"]


def attachment_file_name(reference_id: str) -> str:
    """The file a reference's copy is written to: ``<sha256 hex of the id>.json``."""
    return hashlib.sha256(reference_id.encode("utf-8")).hexdigest() + ".json"


def write_turn_resources(layout: ResourceLayout, command: runtime_pb2.RuntimeCommand) -> None:
    """Create or refresh the Session's resources for a started Turn (blocking; small files).

    Args:
        layout: Where the resources live.
        command: The ``start_turn`` command.

    Raises:
        ValueError: The workspace or Session id is not a safe path component.
        OSError: A file could not be written.
    """
    ws, sid = command.workspace_id, command.session_id
    start = command.start_turn
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    turn = {"workspace_id": ws, "session_id": sid, "turn_id": start.turn_id}
    _write_json(layout.sidecar_dir(sid) / "state.json", {**turn, "updated_at": now})
    attachments = layout.attachments_dir(sid)
    for reference in start.references:
        copy = json_format.MessageToDict(reference, preserving_proto_field_name=True)
        _write_json(attachments / attachment_file_name(reference.id), copy)
    scratch = {**turn, "cwd": start.session.cwd, "updated_at": now}
    _write_json(layout.workspace_dir(ws, sid) / "scratch.json", scratch)
    _write_json(layout.agent_lease(sid) / "lease.json", {**turn, "acquired_at": now})


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        temporary.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
