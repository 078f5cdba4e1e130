"""Validation of ``LoadTopics`` input: every violation is reported, nothing is written (SEC-2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument
from services.issuemanager.topics import IssueTree, TopicTree

__all__ = ["MAX_DETAIL_BYTES", "MAX_ID_LENGTH", "LoadBounds", "validate_topics"]

MAX_ID_LENGTH = 256
"""Longest topic, issue or output id accepted."""

MAX_PATH_LENGTH = 4096
"""Longest output path accepted."""

MAX_DETAIL_BYTES = 1024 * 1024
"""Largest issue ``detail`` (UTF-8) accepted."""


@dataclass(frozen=True)
class LoadBounds:
    """Configured limits of one ``LoadTopics`` request."""

    max_issues: int
    max_outputs: int


def _check_id(value: str, field: str, violations: list[FieldViolation]) -> None:
    if not value:
        violations.append(FieldViolation(field, "must not be empty"))
    elif len(value) > MAX_ID_LENGTH:
        violations.append(FieldViolation(field, f"must be at most {MAX_ID_LENGTH} characters"))


def _check_issue(issue: IssueTree, where: str, violations: list[FieldViolation]) -> None:
    if len(issue.detail.encode("utf-8")) > MAX_DETAIL_BYTES:
        violations.append(FieldViolation(f"{where}.detail", "must be at most 1 MiB (UTF-8)"))
    for name in ("created_at_unix_ms", "updated_at_unix_ms"):
        if getattr(issue, name) < 0:
            violations.append(FieldViolation(f"{where}.{name}", "must not be negative"))
    seen: set[str] = set()
    for index, output in enumerate(issue.outputs):
        at = f"{where}.outputs[{index}]"
        _check_id(output.output_id, f"{at}.output_id", violations)
        if output.output_id and output.output_id in seen:
            violations.append(
                FieldViolation(f"{at}.output_id", "duplicates an output of this issue")
            )
        seen.add(output.output_id)
        if not output.path:
            violations.append(FieldViolation(f"{at}.path", "must not be empty"))
        elif len(output.path) > MAX_PATH_LENGTH:
            violations.append(
                FieldViolation(f"{at}.path", f"must be at most {MAX_PATH_LENGTH} characters")
            )
        if output.size_bytes < 0:
            violations.append(FieldViolation(f"{at}.size_bytes", "must not be negative"))
        if output.created_at_unix_ms < 0:
            violations.append(FieldViolation(f"{at}.created_at_unix_ms", "must not be negative"))


def validate_topics(topics: Sequence[TopicTree], bounds: LoadBounds) -> None:
    """Raise ``InvalidArgument`` listing every problem of a ``LoadTopics`` request.

    Raises:
        InvalidArgument: empty or duplicate ids, empty paths, negative numbers, an
            oversized detail, or more issues or outputs than ``bounds``.
    """
    violations: list[FieldViolation] = []
    topic_ids: set[str] = set()
    issue_ids: set[str] = set()
    issues = outputs = 0
    for t_index, topic in enumerate(topics):
        where = f"topics[{t_index}]"
        _check_id(topic.topic_id, f"{where}.topic_id", violations)
        if topic.topic_id and topic.topic_id in topic_ids:
            violations.append(FieldViolation(f"{where}.topic_id", "duplicates a topic"))
        topic_ids.add(topic.topic_id)
        for i_index, issue in enumerate(topic.issues):
            at = f"{where}.issues[{i_index}]"
            issues += 1
            outputs += len(issue.outputs)
            _check_id(issue.issue_id, f"{at}.issue_id", violations)
            if issue.issue_id and issue.issue_id in issue_ids:
                violations.append(FieldViolation(f"{at}.issue_id", "duplicates an issue"))
            issue_ids.add(issue.issue_id)
            _check_issue(issue, at, violations)
    if issues > bounds.max_issues:
        violations.append(FieldViolation("topics", f"more than {bounds.max_issues} issues"))
    if outputs > bounds.max_outputs:
        violations.append(FieldViolation("topics", f"more than {bounds.max_outputs} outputs"))
    if violations:
        raise InvalidArgument(
            f"LoadTopics request is invalid ({len(violations)} problems)",
            field_violations=violations,
        )
