"""Validation of ``LoadApps`` input: every violation is reported, nothing is written (SEC-2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument
from services.appcenter.artifacts import AppTree, Artifact, GroupTree

__all__ = ["MAX_ID_LENGTH", "MAX_PATH_LENGTH", "LoadBounds", "validate_apps"]

MAX_ID_LENGTH = 256
"""Longest app or group id accepted."""

MAX_PATH_LENGTH = 4096
"""Longest artifact path accepted."""


@dataclass(frozen=True)
class LoadBounds:
    """Configured limits of one ``LoadApps`` request."""

    max_depth: int
    max_groups: int
    max_artifacts: int


def _check_id(value: str, field: str, violations: list[FieldViolation]) -> None:
    if not value:
        violations.append(FieldViolation(field, "must not be empty"))
    elif len(value) > MAX_ID_LENGTH:
        violations.append(FieldViolation(field, f"must be at most {MAX_ID_LENGTH} characters"))


def _check_artifacts(
    artifacts: Sequence[Artifact], prefix: str, violations: list[FieldViolation]
) -> None:
    seen: set[str] = set()
    for index, artifact in enumerate(artifacts):
        where = f"{prefix}.artifacts[{index}]"
        if not artifact.path:
            violations.append(FieldViolation(f"{where}.path", "must not be empty"))
        elif len(artifact.path) > MAX_PATH_LENGTH:
            violations.append(
                FieldViolation(f"{where}.path", f"must be at most {MAX_PATH_LENGTH} characters")
            )
        elif artifact.path in seen:
            violations.append(
                FieldViolation(f"{where}.path", "duplicates a path in this container")
            )
        seen.add(artifact.path)
        if artifact.size_bytes < 0:
            violations.append(FieldViolation(f"{where}.size_bytes", "must not be negative"))
        if artifact.created_at_unix_ms < 0:
            violations.append(FieldViolation(f"{where}.created_at_unix_ms", "must not be negative"))


@dataclass
class _Tally:
    groups: int = 0
    artifacts: int = 0
    deepest: int = 0


def _check_groups(
    groups: Iterable[GroupTree],
    prefix: str,
    depth: int,
    seen_ids: set[str],
    tally: _Tally,
    violations: list[FieldViolation],
    max_depth: int,
) -> None:
    for index, group in enumerate(groups):
        where = f"{prefix}.groups[{index}]"
        tally.groups += 1
        tally.artifacts += len(group.artifacts)
        tally.deepest = max(tally.deepest, depth)
        _check_id(group.group_id, f"{where}.group_id", violations)
        if group.group_id and group.group_id in seen_ids:
            violations.append(FieldViolation(f"{where}.group_id", "duplicates a group of this app"))
        seen_ids.add(group.group_id)
        _check_artifacts(group.artifacts, where, violations)
        if group.groups and depth + 1 > max_depth:
            # Checked before descending: reported once below, never walked deeper.
            tally.deepest = max(tally.deepest, depth + 1)
            continue
        _check_groups(group.groups, where, depth + 1, seen_ids, tally, violations, max_depth)


def validate_apps(apps: Sequence[AppTree], bounds: LoadBounds) -> None:
    """Raise ``InvalidArgument`` listing every problem of a ``LoadApps`` request.

    Raises:
        InvalidArgument: empty or duplicate ids, paths or negative numbers, or a tree
            deeper or larger than ``bounds``.
    """
    violations: list[FieldViolation] = []
    seen_apps: set[str] = set()
    tally = _Tally()
    for index, app in enumerate(apps):
        where = f"apps[{index}]"
        _check_id(app.app_id, f"{where}.app_id", violations)
        if app.app_id and app.app_id in seen_apps:
            violations.append(
                FieldViolation(f"{where}.app_id", "duplicates an app in this request")
            )
        seen_apps.add(app.app_id)
        tally.artifacts += len(app.artifacts)
        _check_artifacts(app.artifacts, where, violations)
        _check_groups(app.groups, where, 1, set(), tally, violations, bounds.max_depth)
    if tally.deepest > bounds.max_depth:
        violations.append(
            FieldViolation("apps", f"groups nest deeper than {bounds.max_depth} levels")
        )
    if tally.groups > bounds.max_groups:
        violations.append(FieldViolation("apps", f"more than {bounds.max_groups} groups"))
    if tally.artifacts > bounds.max_artifacts:
        violations.append(FieldViolation("apps", f"more than {bounds.max_artifacts} artifacts"))
    if violations:
        raise InvalidArgument(
            f"LoadApps request is invalid ({len(violations)} problems)",
            field_violations=violations,
        )
