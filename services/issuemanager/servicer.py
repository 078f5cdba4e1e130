"""Wire layer of ``IssueManagerService`` (REF-BACKEND-1: the store-backed IssueManager backend).

Translates proto -> domain -> proto; the rules live in
:mod:`services.issuemanager.topic_store` and :mod:`services.issuemanager.load_validation`.
"""

from __future__ import annotations

from typing import Any

from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from services.issuemanager.load_validation import LoadBounds, validate_topics
from services.issuemanager.topic_store import TopicStore
from services.issuemanager.topics import IssueOutput, IssueTree, TopicTree


def _output_to(output: IssueOutput) -> issuemanager_pb2.IssueOutput:
    return issuemanager_pb2.IssueOutput(
        output_id=output.output_id,
        path=output.path,
        display_name=output.display_name,
        size_bytes=output.size_bytes,
        media_type=output.media_type,
        created_at_unix_ms=output.created_at_unix_ms,
    )


def _output_from(message: issuemanager_pb2.IssueOutput) -> IssueOutput:
    return IssueOutput(
        output_id=message.output_id,
        path=message.path,
        display_name=message.display_name,
        size_bytes=message.size_bytes,
        media_type=message.media_type,
        created_at_unix_ms=message.created_at_unix_ms,
    )


def _topic_from(message: issuemanager_pb2.TopicTree) -> TopicTree:
    return TopicTree(
        topic_id=message.topic_id,
        title=message.title,
        issues=tuple(
            IssueTree(
                issue_id=issue.issue_id,
                title=issue.title,
                detail=issue.detail,
                created_at_unix_ms=issue.created_at_unix_ms,
                updated_at_unix_ms=issue.updated_at_unix_ms,
                outputs=tuple(_output_from(o) for o in issue.outputs),
            )
            for issue in message.issues
        ),
    )


class IssueManagerServicer(issuemanager_pb2_grpc.IssueManagerServiceServicer):
    """Serves ``agentactivity.issuemanager.v1.IssueManagerService``."""

    def __init__(self, store: TopicStore, bounds: LoadBounds) -> None:
        self._store = store
        self._bounds = bounds

    async def GetIssueDetail(
        self, request: issuemanager_pb2.GetIssueDetailRequest, context: Any
    ) -> issuemanager_pb2.GetIssueDetailResponse:
        """One issue with its latest outputs, newest first (REF-TASK-1)."""
        detail = await self._store.issue_detail(
            request.workspace_id,
            request.issue_id,
            request.topic_id if request.HasField("topic_id") else None,
        )
        issue = detail.issue
        return issuemanager_pb2.GetIssueDetailResponse(
            issue=issuemanager_pb2.Issue(
                issue_id=issue.issue_id,
                topic_id=issue.topic_id,
                title=issue.title,
                detail=issue.detail,
                created_at_unix_ms=issue.created_at_unix_ms,
                updated_at_unix_ms=issue.updated_at_unix_ms,
            ),
            latest_outputs=[_output_to(o) for o in detail.latest_outputs],
            latest_outputs_truncated=detail.latest_outputs_truncated,
        )

    async def SearchIssueOutputs(
        self, request: issuemanager_pb2.SearchIssueOutputsRequest, context: Any
    ) -> issuemanager_pb2.SearchIssueOutputsResponse:
        """One page of a topic's latest outputs, newest first (REF-TASK-1)."""
        page = await self._store.search_outputs(
            request.workspace_id,
            request.topic_id,
            request.query if request.HasField("query") else None,
            request.page_size,
            request.page_token,
        )
        return issuemanager_pb2.SearchIssueOutputsResponse(
            outputs=[
                issuemanager_pb2.TopicOutput(issue_id=hit.issue_id, output=_output_to(hit.output))
                for hit in page.outputs
            ],
            next_page_token=page.next_page_token,
        )

    async def LoadTopics(
        self, request: issuemanager_pb2.LoadTopicsRequest, context: Any
    ) -> issuemanager_pb2.LoadTopicsResponse:
        """Create or replace whole topic trees in one transaction; admin only (REF-BACKEND-1)."""
        topics = [_topic_from(topic) for topic in request.topics]
        validate_topics(topics, self._bounds)
        counts = await self._store.load(request.workspace_id, topics)
        return issuemanager_pb2.LoadTopicsResponse(
            topics_loaded=counts.topics,
            issues_loaded=counts.issues,
            outputs_loaded=counts.outputs,
        )

    async def DeleteTopic(
        self, request: issuemanager_pb2.DeleteTopicRequest, context: Any
    ) -> issuemanager_pb2.DeleteTopicResponse:
        """Remove a topic with its issues and outputs; admin only (REF-BACKEND-1)."""
        deleted = await self._store.delete(
            request.workspace_id, request.topic_id, allow_missing=request.allow_missing
        )
        return issuemanager_pb2.DeleteTopicResponse(deleted=deleted)
