"""Wire layer of ``ReferenceService`` (REF-API-1, REF-URI-1, REF-EXP-1, REF-SKILL-1).

Translates proto -> domain -> proto. Each call's :class:`Deadline` is the caller's gRPC
deadline capped by the configured resolution timeout, and it bounds every backend call.
"""

from __future__ import annotations

import math
from typing import Any

from google.rpc import code_pb2

from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from domainerrors import PermissionDenied
from services.refresolve.backends import Deadline
from services.refresolve.expansion import expand_mentions
from services.refresolve.mention_uri import parse_mention
from services.refresolve.references import (
    ReferenceHandle,
    ReferenceItem,
    Resolution,
    ResolveRequest,
    Source,
)
from services.refresolve.resolver import Resolver
from services.refresolve.skill import skill_bundle

_SOURCE_FROM_WIRE = {
    refresolve_pb2.REFERENCE_SOURCE_APP: Source.APP,
    refresolve_pb2.REFERENCE_SOURCE_TASK: Source.TASK,
}
_SOURCE_TO_WIRE = {source: wire for wire, source in _SOURCE_FROM_WIRE.items()}


def _item(item: ReferenceItem) -> refresolve_pb2.ReferenceItem:
    return refresolve_pb2.ReferenceItem(
        path=item.path,
        display_name=item.display_name,
        size_bytes=item.size_bytes,
        media_type=item.media_type,
        created_at_unix_ms=item.created_at_unix_ms,
    )


def _items(resolution: Resolution) -> list[refresolve_pb2.ReferenceItem]:
    return [_item(item) for item in resolution.items]


def _handle(handle: ReferenceHandle) -> refresolve_pb2.ReferenceHandle:
    return refresolve_pb2.ReferenceHandle(
        source=_SOURCE_TO_WIRE[handle.source],
        id=handle.id,
        group_id=handle.group_id,
        workspace_id=handle.workspace_id,
    )


class ReferenceServicer(refresolve_pb2_grpc.ReferenceServiceServicer):
    """Serves ``agentactivity.refresolve.v1.ReferenceService``."""

    def __init__(self, resolver: Resolver, *, timeout_seconds: float) -> None:
        self._resolver = resolver
        self._timeout = timeout_seconds

    def _deadline(self, context: Any) -> Deadline:
        remaining = context.time_remaining()
        caller = math.inf if remaining is None else remaining
        return Deadline(min(caller, self._timeout))

    async def ListReferences(
        self, request: refresolve_pb2.ListReferencesRequest, context: Any
    ) -> refresolve_pb2.ListReferencesResponse:
        """Resolve one handle into a flat, de-duplicated file list (REF-API-1)."""
        resolution = await self._resolver.resolve(
            ResolveRequest(
                workspace_id=request.workspace_id,
                source=_SOURCE_FROM_WIRE.get(request.source),
                id=request.id,
                group_id=request.group_id if request.HasField("group_id") else None,
                query=request.query if request.HasField("query") else None,
                limit=request.limit if request.HasField("limit") else None,
            ),
            self._deadline(context),
        )
        return refresolve_pb2.ListReferencesResponse(
            items=_items(resolution), truncated=resolution.truncated
        )

    async def ResolveMention(
        self, request: refresolve_pb2.ResolveMentionRequest, context: Any
    ) -> refresolve_pb2.ResolveMentionResponse:
        """Parse a mention URI and resolve its handle (REF-URI-1, REF-API-1)."""
        handle = parse_mention(request.uri).handle
        if handle.workspace_id != request.workspace_id:
            raise PermissionDenied(
                f"the mention's workspace {handle.workspace_id!r} is not {request.workspace_id!r}",
                reason="WORKSPACE_SCOPE_MISMATCH",
                metadata={"workspace_id": handle.workspace_id},
            )
        resolution = await self._resolver.resolve(
            ResolveRequest(
                workspace_id=request.workspace_id,
                source=handle.source,
                id=handle.id,
                group_id=handle.group_id,
            ),
            self._deadline(context),
        )
        return refresolve_pb2.ResolveMentionResponse(
            handle=_handle(handle), items=_items(resolution), truncated=resolution.truncated
        )

    async def ExpandMentions(
        self, request: refresolve_pb2.ExpandMentionsRequest, context: Any
    ) -> refresolve_pb2.ExpandMentionsResponse:
        """Resolve every workspace-reference mention of a detail text (REF-EXP-1)."""
        expansions = await expand_mentions(
            self._resolver,
            request.workspace_id,
            request.text,
            request.limit_per_mention if request.HasField("limit_per_mention") else None,
            self._deadline(context),
        )
        response = refresolve_pb2.ExpandMentionsResponse()
        for expansion in expansions:
            occurrence = expansion.occurrence
            message = response.expansions.add(
                start=occurrence.start, end=occurrence.end, uri=occurrence.uri
            )
            if occurrence.label is not None:
                message.label = occurrence.label
            if expansion.handle is not None:
                message.handle.CopyFrom(_handle(expansion.handle))
            if expansion.resolution is not None:
                message.resolved.items.extend(_items(expansion.resolution))
                message.resolved.truncated = expansion.resolution.truncated
            elif expansion.failure is not None:
                message.failure.code = code_pb2.Code.Value(expansion.failure.status)
                message.failure.reason = expansion.failure.reason
                message.failure.message = expansion.failure.message
        return response

    async def GetReferenceSkill(
        self, request: refresolve_pb2.GetReferenceSkillRequest, context: Any
    ) -> refresolve_pb2.GetReferenceSkillResponse:
        """The shipped read-only ``reference`` skill and its routing policy (REF-SKILL-1)."""
        bundle = skill_bundle()
        return refresolve_pb2.GetReferenceSkillResponse(
            skill=refresolve_pb2.ReferenceSkill(
                name=bundle.skill.name,
                description=bundle.skill.description,
                body_markdown=bundle.skill.body_markdown,
                read_only=bundle.skill.read_only,
            ),
            routing_policy=refresolve_pb2.MentionRoutingPolicy(
                mention_uri_prefix=bundle.policy.mention_uri_prefix,
                skill_name=bundle.policy.skill_name,
                policy_text=bundle.policy.policy_text,
            ),
            revision=bundle.revision,
        )
