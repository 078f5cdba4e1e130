"""User projects: workspace rail sections (HOST-PROJ-1, HOST-SES-2).

A project is a workspace record (key, label, path). Its key is the ``rail_section_key`` of
its member Sessions; the conversations section is the reserved key ``conversations`` and
is no project. ``RemoveProject`` (``services.host.deletion.project_removal``) is the only operation
that changes a persisted ``rail_section_key``.
"""

from __future__ import annotations

import posixpath
import re
import uuid

from domainerrors import (
    AlreadyExists,
    FieldViolation,
    InvalidArgument,
    NotFound,
)
from services.host.context import HostContext
from services.host.model.session_rules import CONVERSATIONS_SECTION_KEY
from services.host.repository.projects import ProjectRecord
from services.host.repository.unit_of_work import HostTransaction

__all__ = [
    "ProjectRecord",
    "add_project",
    "list_projects",
    "project_containing",
    "project_not_found",
    "validate_section_key",
]

MAX_KEY_LENGTH = 128
MAX_LABEL_LENGTH = 256
MAX_PATH_LENGTH = 4096
_KEY = re.compile(r"[^\s\x00-\x1f\x7f]+")


def validate_section_key(key: str, field: str) -> FieldViolation | None:
    """The violation for a malformed section key, if any (the reserved key is allowed)."""
    if not key:
        return FieldViolation(field, "is required")
    if len(key) > MAX_KEY_LENGTH or not _KEY.fullmatch(key):
        return FieldViolation(
            field, f"must be 1-{MAX_KEY_LENGTH} characters without whitespace or control characters"
        )
    return None


def _text_violation(value: str, field: str, limit: int) -> FieldViolation | None:
    if not value.strip():
        return FieldViolation(field, "is required")
    if len(value) > limit:
        return FieldViolation(field, f"must be at most {limit} characters")
    if re.search(r"[\x00-\x1f\x7f]", value):
        return FieldViolation(field, "must not contain control characters")
    return None


def project_not_found(workspace_id: str, section_key: str) -> NotFound:
    """The typed error for an unknown project key."""
    return NotFound(
        f"no project {section_key!r} in workspace {workspace_id!r}",
        reason="PROJECT_NOT_FOUND",
        metadata={"section_key": section_key},
    )


async def add_project(
    ctx: HostContext, workspace_id: str, section_key: str | None, label: str, path: str
) -> ProjectRecord:
    """Create a project; an identical replay of a caller-keyed add returns the stored one.

    Raises:
        InvalidArgument: a malformed or the reserved key, an empty label or path.
        AlreadyExists: reason ``PROJECT_EXISTS``; the key is used with another label or path.
    """
    violations = [
        v
        for v in (
            None if section_key is None else validate_section_key(section_key, "section_key"),
            _text_violation(label, "label", MAX_LABEL_LENGTH),
            _text_violation(path, "path", MAX_PATH_LENGTH),
        )
        if v is not None
    ]
    if section_key == CONVERSATIONS_SECTION_KEY:
        violations.append(
            FieldViolation("section_key", "is the reserved conversations key, not a project")
        )
    if violations:
        raise InvalidArgument("invalid project", field_violations=violations)
    project = ProjectRecord(
        workspace_id=workspace_id,
        section_key=section_key or f"project-{uuid.uuid4().hex}",
        label=label.strip(),
        path=path,
        created_at_unix_ms=ctx.clock(),
    )

    async def command(repos: HostTransaction) -> ProjectRecord:
        if await repos.projects.insert(project):
            return project
        existing = await repos.projects.get(workspace_id, project.section_key)
        if existing is not None and (existing.label, existing.path) == (
            project.label,
            project.path,
        ):
            return existing
        raise AlreadyExists(
            f"project key {project.section_key!r} is in use",
            reason="PROJECT_EXISTS",
            metadata={"section_key": project.section_key},
        )

    return await ctx.transact(command)


async def list_projects(ctx: HostContext, workspace_id: str) -> list[ProjectRecord]:
    """The workspace's projects ordered by label, then key."""

    async def query(repos: HostTransaction) -> list[ProjectRecord]:
        return await repos.projects.in_workspace(workspace_id)

    return await ctx.transact(query, write=False)


def project_containing(projects: list[ProjectRecord], cwd: str) -> ProjectRecord | None:
    """The project whose path contains ``cwd`` (the deepest one), if any (HOST-SES-2)."""
    best: ProjectRecord | None = None
    target = posixpath.normpath(cwd) if cwd else ""
    for project in projects:
        root = posixpath.normpath(project.path)
        inside = target == root or target.startswith(root.rstrip("/") + "/")
        if inside and (best is None or len(root) > len(posixpath.normpath(best.path))):
            best = project
    return best
