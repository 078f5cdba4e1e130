"""SQL of the store-backed IssueManager: issue details, topic output search, topic loads.

Owns the ``issuemanager_*`` tables (ARCH-2). ``is_latest`` is computed when a topic is
loaded (loads replace whole topics, so it is never stale). Reads order latest outputs
newest first: ``created_at_unix_ms`` descending, then issue id, then output id (code
point order); search pages are keyset slices of that order (``store.page_tokens``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import Select, and_, delete, insert, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from domainerrors import FailedPrecondition, InvalidArgument, NotFound
from services.issuemanager.topics import (
    Issue,
    IssueDetail,
    IssueOutput,
    LoadCounts,
    OutputPage,
    TopicOutput,
    TopicTree,
    latest_output_ids,
    output_id_of,
    output_key,
)
from store import page_tokens
from store.codepoint import codepoint
from store.database import Database
from store.models import IssueManagerIssue, IssueManagerOutput, IssueManagerTopic
from store.transactions import write_connection

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "MAX_QUERY_LENGTH", "TopicStore"]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_QUERY_LENGTH = 256
"""Longest ``SearchIssueOutputs.query`` accepted (SEC-2; the reference resolver's bound)."""
_LOAD_LOCK_KEY = 0x49534D47  # "ISMG": serializes concurrent loads on Postgres
_IN_CHUNK = 500  # ids per IN (...) list, well under SQLite's bound-parameter limit

_OUTPUT_COLUMNS = (
    IssueManagerOutput.issue_id,
    IssueManagerOutput.output_id,
    IssueManagerOutput.path,
    IssueManagerOutput.display_name,
    IssueManagerOutput.size_bytes,
    IssueManagerOutput.media_type,
    IssueManagerOutput.created_at_unix_ms,
)
_NEWEST_FIRST = (
    IssueManagerOutput.created_at_unix_ms.desc(),
    codepoint(IssueManagerOutput.issue_id),
    codepoint(IssueManagerOutput.output_id),
)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _output(row: Any) -> IssueOutput:
    return IssueOutput(
        output_id=output_id_of(row.issue_id, row.output_id),
        path=row.path,
        display_name=row.display_name,
        size_bytes=row.size_bytes,
        media_type=row.media_type,
        created_at_unix_ms=row.created_at_unix_ms,
    )


def _issue_not_found(issue_id: str) -> NotFound:
    return NotFound(
        f"issue {issue_id!r} does not exist",
        reason="ISSUE_NOT_FOUND",
        metadata={"issue_id": issue_id},
    )


def _topic_not_found(topic_id: str) -> NotFound:
    return NotFound(
        f"topic {topic_id!r} does not exist",
        reason="TOPIC_NOT_FOUND",
        metadata={"topic_id": topic_id},
    )


class TopicStore:
    """Reads and writes topics, issues and outputs."""

    def __init__(
        self,
        database: Database,
        *,
        detail_max_outputs: int,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._database = database
        self._detail_max = detail_max_outputs
        self._clock = clock

    async def issue_detail(
        self, workspace_id: str, issue_id: str, topic_id: str | None
    ) -> IssueDetail:
        """Return an issue with its latest outputs (at most the configured detail bound).

        Raises:
            InvalidArgument: empty ``issue_id``, or ``topic_id`` set but empty.
            NotFound: ``ISSUE_NOT_FOUND`` (also for an issue of another topic).
        """
        if not issue_id:
            raise InvalidArgument.for_field("issue_id", "must not be empty")
        if topic_id is not None and not topic_id:
            raise InvalidArgument.for_field("topic_id", "must not be empty when set")
        async with self._database.engine.connect() as connection:
            row = (
                await connection.execute(
                    select(IssueManagerIssue).where(
                        IssueManagerIssue.workspace_id == workspace_id,
                        IssueManagerIssue.issue_id == issue_id,
                    )
                )
            ).first()
            if row is None or (topic_id is not None and row.topic_id != topic_id):
                raise _issue_not_found(issue_id)
            outputs = (
                await connection.execute(
                    select(*_OUTPUT_COLUMNS)
                    .where(
                        IssueManagerOutput.workspace_id == workspace_id,
                        IssueManagerOutput.issue_id == issue_id,
                        IssueManagerOutput.is_latest.is_(True),
                    )
                    .order_by(*_NEWEST_FIRST)
                    .limit(self._detail_max + 1)
                )
            ).all()
        issue = Issue(
            issue_id=row.issue_id,
            topic_id=row.topic_id,
            title=row.title,
            detail=row.detail,
            created_at_unix_ms=row.created_at_unix_ms,
            updated_at_unix_ms=row.updated_at_unix_ms,
        )
        truncated = len(outputs) > self._detail_max
        return IssueDetail(issue, tuple(_output(o) for o in outputs[: self._detail_max]), truncated)

    async def search_outputs(
        self,
        workspace_id: str,
        topic_id: str,
        query: str | None,
        page_size: int,
        page_token: str,
    ) -> OutputPage:
        """Return one page of the latest outputs of every issue in a topic, newest first.

        Raises:
            InvalidArgument: empty ``topic_id``, a ``query`` longer than
                :data:`MAX_QUERY_LENGTH`, negative size, bad or mismatched token.
            NotFound: ``TOPIC_NOT_FOUND``.
        """
        size = _search_page_size(topic_id, query, page_size)
        query = query or None
        binding = {"workspace_id": workspace_id, "topic_id": topic_id, "query": query}
        statement = _outputs_statement(
            workspace_id, topic_id, query, self._search_position(page_token, binding)
        ).limit(size + 1)
        async with self._database.engine.connect() as connection:
            exists = await connection.scalar(
                select(IssueManagerTopic.topic_id).where(
                    IssueManagerTopic.workspace_id == workspace_id,
                    IssueManagerTopic.topic_id == topic_id,
                )
            )
            if exists is None:
                raise _topic_not_found(topic_id)
            rows = (await connection.execute(statement)).all()
        token = ""
        if len(rows) > size:
            rows = rows[:size]
            last = rows[-1]
            token = page_tokens.encode(
                binding, [last.created_at_unix_ms, last.issue_id, last.output_id]
            )
        outputs = tuple(TopicOutput(row.issue_id, _output(row)) for row in rows)
        return OutputPage(outputs, token)

    @staticmethod
    def _search_position(token: str, binding: dict[str, str | None]) -> tuple[int, str, str] | None:
        if not token:
            return None
        try:
            values = page_tokens.decode(token, binding)
        except page_tokens.MalformedPageToken as error:
            raise InvalidArgument.for_field("page_token", str(error)) from None
        if (
            len(values) != 3
            or not isinstance(values[0], int)
            or not isinstance(values[1], str)
            or not isinstance(values[2], str)
        ):
            raise InvalidArgument.for_field("page_token", "page_token is malformed")
        return values[0], values[1], values[2]

    async def load(self, workspace_id: str, topics: Sequence[TopicTree]) -> LoadCounts:
        """Create or replace each topic tree; all commit in one transaction or none do.

        Raises:
            FailedPrecondition: ``ISSUE_IN_OTHER_TOPIC`` when an issue id already belongs to
                a topic this request does not replace.
        """
        now = self._clock()
        issue_rows: list[dict[str, Any]] = []
        output_rows: list[dict[str, Any]] = []
        for topic in topics:
            for issue in topic.issues:
                issue_rows.append(
                    {
                        "workspace_id": workspace_id,
                        "issue_id": issue.issue_id,
                        "topic_id": topic.topic_id,
                        "title": issue.title,
                        "detail": issue.detail,
                        "created_at_unix_ms": issue.created_at_unix_ms or now,
                        "updated_at_unix_ms": issue.updated_at_unix_ms or now,
                    }
                )
                stamped = [
                    o if o.created_at_unix_ms else replace(o, created_at_unix_ms=now)
                    for o in issue.outputs
                ]
                latest = latest_output_ids(stamped)
                output_rows.extend(
                    {
                        "workspace_id": workspace_id,
                        "output_id": output_key(issue.issue_id, output.output_id),
                        "issue_id": issue.issue_id,
                        "path": output.path,
                        "display_name": output.display_name,
                        "size_bytes": output.size_bytes,
                        "media_type": output.media_type,
                        "created_at_unix_ms": output.created_at_unix_ms,
                        "is_latest": output.output_id in latest,
                    }
                    for output in stamped
                )
        topic_ids = [topic.topic_id for topic in topics]
        async with write_connection(self._database.engine) as connection:
            if connection.dialect.name == "postgresql":
                await connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOAD_LOCK_KEY}
                )
            await self._refuse_moved_issues(
                connection, workspace_id, [row["issue_id"] for row in issue_rows], topic_ids
            )
            for topic in topics:
                await self._replace_topic_row(connection, workspace_id, topic, now)
            if issue_rows:
                await connection.execute(insert(IssueManagerIssue), issue_rows)
            if output_rows:
                await connection.execute(insert(IssueManagerOutput), output_rows)
        return LoadCounts(len(topics), len(issue_rows), len(output_rows))

    @staticmethod
    async def _refuse_moved_issues(
        connection: AsyncConnection,
        workspace_id: str,
        issue_ids: Sequence[str],
        topic_ids: Sequence[str],
    ) -> None:
        for start in range(0, len(issue_ids), _IN_CHUNK):
            chunk = issue_ids[start : start + _IN_CHUNK]
            clash = (
                await connection.execute(
                    select(IssueManagerIssue.issue_id, IssueManagerIssue.topic_id)
                    .where(
                        IssueManagerIssue.workspace_id == workspace_id,
                        IssueManagerIssue.issue_id.in_(chunk),
                        IssueManagerIssue.topic_id.not_in(topic_ids),
                    )
                    .limit(1)
                )
            ).first()
            if clash is not None:
                raise FailedPrecondition(
                    f"issue {clash.issue_id!r} belongs to topic {clash.topic_id!r}, "
                    "which this request does not replace",
                    reason="ISSUE_IN_OTHER_TOPIC",
                    metadata={"issue_id": clash.issue_id, "topic_id": clash.topic_id},
                )

    @staticmethod
    async def _replace_topic_row(
        connection: AsyncConnection, workspace_id: str, topic: TopicTree, now: int
    ) -> None:
        issues_of_topic = select(IssueManagerIssue.issue_id).where(
            IssueManagerIssue.workspace_id == workspace_id,
            IssueManagerIssue.topic_id == topic.topic_id,
        )
        await connection.execute(
            delete(IssueManagerOutput).where(
                IssueManagerOutput.workspace_id == workspace_id,
                IssueManagerOutput.issue_id.in_(issues_of_topic),
            )
        )
        await connection.execute(
            delete(IssueManagerIssue).where(
                IssueManagerIssue.workspace_id == workspace_id,
                IssueManagerIssue.topic_id == topic.topic_id,
            )
        )
        updated = await connection.execute(
            update(IssueManagerTopic)
            .where(
                IssueManagerTopic.workspace_id == workspace_id,
                IssueManagerTopic.topic_id == topic.topic_id,
            )
            .values(title=topic.title, updated_at_unix_ms=now)
        )
        if updated.rowcount == 0:
            await connection.execute(
                insert(IssueManagerTopic).values(
                    workspace_id=workspace_id,
                    topic_id=topic.topic_id,
                    title=topic.title,
                    created_at_unix_ms=now,
                    updated_at_unix_ms=now,
                )
            )

    async def delete(self, workspace_id: str, topic_id: str, *, allow_missing: bool) -> bool:
        """Remove a topic with its issues and outputs (the database cascades).

        Raises:
            InvalidArgument: empty ``topic_id``.
            NotFound: ``TOPIC_NOT_FOUND`` unless ``allow_missing``.
        """
        if not topic_id:
            raise InvalidArgument.for_field("topic_id", "must not be empty")
        async with write_connection(self._database.engine) as connection:
            result = await connection.execute(
                delete(IssueManagerTopic).where(
                    IssueManagerTopic.workspace_id == workspace_id,
                    IssueManagerTopic.topic_id == topic_id,
                )
            )
        if result.rowcount == 0 and not allow_missing:
            raise _topic_not_found(topic_id)
        return result.rowcount > 0


def _search_page_size(topic_id: str, query: str | None, page_size: int) -> int:
    """The page size of a ``SearchTopicOutputs`` call, after its field checks."""
    if not topic_id:
        raise InvalidArgument.for_field("topic_id", "must not be empty")
    if query is not None and len(query) > MAX_QUERY_LENGTH:
        raise InvalidArgument.for_field("query", f"must be at most {MAX_QUERY_LENGTH} characters")
    if page_size < 0:
        raise InvalidArgument.for_field("page_size", "must not be negative")
    return DEFAULT_PAGE_SIZE if page_size == 0 else min(page_size, MAX_PAGE_SIZE)


def _outputs_statement(
    workspace_id: str, topic_id: str, query: str | None, after: tuple[int, str, str] | None
) -> Select[str, str, str, str, int, str, int]:
    """The latest outputs of the topic's issues, newest first, after a page position."""
    statement = (
        select(*_OUTPUT_COLUMNS)
        .join(
            IssueManagerIssue,
            and_(
                IssueManagerIssue.workspace_id == IssueManagerOutput.workspace_id,
                IssueManagerIssue.issue_id == IssueManagerOutput.issue_id,
            ),
        )
        .where(
            IssueManagerOutput.workspace_id == workspace_id,
            IssueManagerIssue.topic_id == topic_id,
            IssueManagerOutput.is_latest.is_(True),
        )
    )
    if query is not None:
        # Case-insensitive substring of the display name (SQLite folds ASCII only).
        statement = statement.where(
            IssueManagerOutput.display_name.icontains(query, autoescape=True)
        )
    if after is not None:
        created, issue_id, key = after
        statement = statement.where(
            or_(
                IssueManagerOutput.created_at_unix_ms < created,
                and_(
                    IssueManagerOutput.created_at_unix_ms == created,
                    or_(
                        codepoint(IssueManagerOutput.issue_id) > issue_id,
                        and_(
                            IssueManagerOutput.issue_id == issue_id,
                            codepoint(IssueManagerOutput.output_id) > key,
                        ),
                    ),
                ),
            )
        )
    return statement.order_by(*_NEWEST_FIRST)
