"""Domain types of the store-backed IssueManager backend (REF-BACKEND-1, REF-TASK-1).

A topic holds issues; an issue holds outputs, several of which may share a path
(revisions of one file). The *latest* outputs of an issue are, per path, the output with
the greatest ``created_at_unix_ms`` (ties: the smallest ``output_id``); reads return only
those, newest first. Output ids are unique within their issue, while the store's key is
workspace-wide, so rows carry :func:`output_key`, which embeds the issue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "Issue",
    "IssueDetail",
    "IssueOutput",
    "IssueTree",
    "LoadCounts",
    "OutputPage",
    "TopicOutput",
    "TopicTree",
    "latest_output_ids",
    "output_id_of",
    "output_key",
]


@dataclass(frozen=True)
class IssueOutput:
    """One file produced for an issue (read and load shape)."""

    output_id: str
    path: str
    display_name: str
    size_bytes: int
    media_type: str
    created_at_unix_ms: int


@dataclass(frozen=True)
class Issue:
    """The read view of one issue."""

    issue_id: str
    topic_id: str
    title: str
    detail: str
    created_at_unix_ms: int
    updated_at_unix_ms: int


@dataclass(frozen=True)
class IssueDetail:
    """An issue with its latest outputs (at most the detail bound)."""

    issue: Issue
    latest_outputs: tuple[IssueOutput, ...]
    latest_outputs_truncated: bool


@dataclass(frozen=True)
class TopicOutput:
    """A search hit: a latest output and its issue."""

    issue_id: str
    output: IssueOutput


@dataclass(frozen=True)
class OutputPage:
    """One page of a topic's latest outputs."""

    outputs: tuple[TopicOutput, ...]
    next_page_token: str


@dataclass(frozen=True)
class IssueTree:
    """An issue with all its outputs, as loaded."""

    issue_id: str
    title: str
    detail: str
    created_at_unix_ms: int
    updated_at_unix_ms: int
    outputs: tuple[IssueOutput, ...]


@dataclass(frozen=True)
class TopicTree:
    """A topic with all its issues, as loaded."""

    topic_id: str
    title: str
    issues: tuple[IssueTree, ...]


@dataclass(frozen=True)
class LoadCounts:
    """What one load wrote."""

    topics: int
    issues: int
    outputs: int


def output_key(issue_id: str, output_id: str) -> str:
    """The stored ``output_id``: unique per workspace, ordered like ``output_id`` in an issue."""
    return f"{len(issue_id)}:{issue_id}/{output_id}"


def output_id_of(issue_id: str, key: str) -> str:
    """Invert :func:`output_key` for a key of ``issue_id``."""
    return key[len(output_key(issue_id, "")) :]


def latest_output_ids(outputs: Iterable[IssueOutput]) -> set[str]:
    """The ids of the latest output per path: newest wins, ties go to the smallest id."""
    best: dict[str, IssueOutput] = {}
    for output in outputs:
        current = best.get(output.path)
        if current is None or (-output.created_at_unix_ms, output.output_id) < (
            -current.created_at_unix_ms,
            current.output_id,
        ):
            best[output.path] = output
    return {output.output_id for output in best.values()}
