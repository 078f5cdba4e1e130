"""Wire layer of ``AppCenterService`` (REF-BACKEND-1: the store-backed AppCenter backend).

Translates proto -> domain -> proto; the rules live in :mod:`services.appcenter.app_store`
and :mod:`services.appcenter.load_validation`.
"""

from __future__ import annotations

from typing import Any

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from domainerrors import FieldViolation, InvalidArgument
from grpcserver.auth import Role, current_principal
from services.appcenter.app_store import AppStore
from services.appcenter.artifacts import AppTree, Artifact, GroupTree
from services.appcenter.load_validation import LoadBounds, validate_apps


def _artifact_from(message: appcenter_pb2.Artifact) -> Artifact:
    return Artifact(
        path=message.path,
        display_name=message.display_name,
        size_bytes=message.size_bytes,
        media_type=message.media_type,
        created_at_unix_ms=message.created_at_unix_ms,
    )


def _artifact_to(artifact: Artifact) -> appcenter_pb2.Artifact:
    return appcenter_pb2.Artifact(
        path=artifact.path,
        display_name=artifact.display_name,
        size_bytes=artifact.size_bytes,
        media_type=artifact.media_type,
        created_at_unix_ms=artifact.created_at_unix_ms,
    )


def _group_from(
    message: appcenter_pb2.ArtifactGroupTree, where: str, depth: int, max_depth: int
) -> GroupTree:
    # SEC-4: the bound is checked before descending, so neither this conversion nor the
    # validation below ever recurses deeper than ``max_depth`` + 1 levels.
    if depth > max_depth:
        raise InvalidArgument(
            f"LoadApps request is invalid: groups nest deeper than {max_depth} levels",
            field_violations=[
                FieldViolation("apps", f"groups nest deeper than {max_depth} levels (at {where})")
            ],
        )
    return GroupTree(
        group_id=message.group_id,
        display_name=message.display_name,
        groups=tuple(
            _group_from(child, f"{where}.groups[{index}]", depth + 1, max_depth)
            for index, child in enumerate(message.groups)
        ),
        artifacts=tuple(_artifact_from(a) for a in message.artifacts),
    )


def _app_from(message: appcenter_pb2.AppTree, where: str, max_depth: int) -> AppTree:
    return AppTree(
        app_id=message.app_id,
        display_name=message.display_name,
        groups=tuple(
            _group_from(group, f"{where}.groups[{index}]", 1, max_depth)
            for index, group in enumerate(message.groups)
        ),
        artifacts=tuple(_artifact_from(a) for a in message.artifacts),
    )


class AppCenterServicer(appcenter_pb2_grpc.AppCenterServiceServicer):
    """Serves ``agentactivity.appcenter.v1.AppCenterService``."""

    def __init__(self, store: AppStore, bounds: LoadBounds) -> None:
        self._store = store
        self._bounds = bounds

    async def ListReferences(
        self, request: appcenter_pb2.ListReferencesRequest, context: Any
    ) -> appcenter_pb2.ListReferencesResponse:
        """One page of a container's direct child groups and files (REF-APP-1)."""
        page = await self._store.list_page(
            request.workspace_id,
            request.app_id,
            request.group_id if request.HasField("group_id") else None,
            request.page_size,
            request.page_token,
        )
        return appcenter_pb2.ListReferencesResponse(
            groups=[
                appcenter_pb2.ArtifactGroup(group_id=g.group_id, display_name=g.display_name)
                for g in page.groups
            ],
            files=[_artifact_to(f) for f in page.files],
            next_page_token=page.next_page_token,
        )

    async def LoadApps(
        self, request: appcenter_pb2.LoadAppsRequest, context: Any
    ) -> appcenter_pb2.LoadAppsResponse:
        """Create or replace whole app trees in one transaction; admin only (REF-BACKEND-1)."""
        current_principal().require_role(Role.ADMIN)
        apps = [
            _app_from(app, f"apps[{index}]", self._bounds.max_depth)
            for index, app in enumerate(request.apps)
        ]
        validate_apps(apps, self._bounds)
        counts = await self._store.load(request.workspace_id, apps)
        return appcenter_pb2.LoadAppsResponse(
            apps_loaded=counts.apps,
            groups_loaded=counts.groups,
            artifacts_loaded=counts.artifacts,
        )

    async def DeleteApp(
        self, request: appcenter_pb2.DeleteAppRequest, context: Any
    ) -> appcenter_pb2.DeleteAppResponse:
        """Remove an app with its groups and artifacts; admin only (REF-BACKEND-1)."""
        current_principal().require_role(Role.ADMIN)
        deleted = await self._store.delete(
            request.workspace_id, request.app_id, allow_missing=request.allow_missing
        )
        return appcenter_pb2.DeleteAppResponse(deleted=deleted)
