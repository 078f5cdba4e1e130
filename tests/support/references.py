"""Reference-resolution test helpers: the three reference servers and their data.

``reference_suite`` starts AppCenter and IssueManager on the test's migrated database
and refresolve pointed at them with the service token, exactly as ``tutti up`` wires
them. ``FakeAppCenter`` is a scriptable AppCenter for failure and slowness tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.issuemanager.v1 import issuemanager_pb2, issuemanager_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from tests.support.servers import LiveServer, auth_metadata

ADMIN = auth_metadata("admin")
WS1 = auth_metadata("ws1-device")
APP = refresolve_pb2.REFERENCE_SOURCE_APP
TASK = refresolve_pb2.REFERENCE_SOURCE_TASK


def artifact(path: str, name: str | None = None, **fields: Any) -> dict[str, Any]:
    """An Artifact / IssueOutput in proto3 JSON with a stable created time."""
    return {
        "path": path,
        "displayName": name or path.rsplit("/", 1)[-1],
        "sizeBytes": fields.pop("sizeBytes", 10),
        "mediaType": fields.pop("mediaType", "text/plain"),
        "createdAtUnixMs": fields.pop("createdAtUnixMs", 1_780_000_000_000),
        **fields,
    }


@dataclass
class ReferenceSuite:
    """The three started servers and stubs to them."""

    appcenter: LiveServer
    issuemanager: LiveServer
    refresolve: LiveServer

    @property
    def resolver(self) -> refresolve_pb2_grpc.ReferenceServiceStub:
        """Stub of ReferenceService."""
        return refresolve_pb2_grpc.ReferenceServiceStub(self.refresolve.channel)

    @property
    def apps(self) -> appcenter_pb2_grpc.AppCenterServiceStub:
        """Stub of AppCenterService."""
        return appcenter_pb2_grpc.AppCenterServiceStub(self.appcenter.channel)

    @property
    def issues(self) -> issuemanager_pb2_grpc.IssueManagerServiceStub:
        """Stub of IssueManagerService."""
        return issuemanager_pb2_grpc.IssueManagerServiceStub(self.issuemanager.channel)

    def load_apps(self, apps: Sequence[dict[str, Any]], workspace: str = "ws-1") -> None:
        """LoadApps as admin from proto3 JSON app trees."""
        request = json_format.ParseDict(
            {"workspaceId": workspace, "apps": list(apps)}, appcenter_pb2.LoadAppsRequest()
        )
        self.apps.LoadApps(request, metadata=ADMIN, timeout=30)

    def load_topics(self, topics: Sequence[dict[str, Any]], workspace: str = "ws-1") -> None:
        """LoadTopics as admin from proto3 JSON topic trees."""
        request = json_format.ParseDict(
            {"workspaceId": workspace, "topics": list(topics)}, issuemanager_pb2.LoadTopicsRequest()
        )
        self.issues.LoadTopics(request, metadata=ADMIN, timeout=30)

    def list(self, **fields: Any) -> refresolve_pb2.ListReferencesResponse:
        """ListReferences in ws-1 as the ws-1 device."""
        fields.setdefault("workspace_id", "ws-1")
        request = refresolve_pb2.ListReferencesRequest(**fields)
        return self.resolver.ListReferences(request, metadata=WS1, timeout=30)


def start_refresolve(
    live_server: Callable[..., LiveServer], appcenter: str, issuemanager: str, **overrides: Any
) -> LiveServer:
    """refresolve wired to the given backend addresses with the service token."""
    return live_server(
        "refresolve",
        appcenter_address=appcenter,
        issuemanager_address=issuemanager,
        service_token="token-service",
        **overrides,
    )


@pytest.fixture
def reference_suite(live_server: Callable[..., LiveServer], migrated_db_url: str) -> ReferenceSuite:
    """AppCenter + IssueManager on the test database and refresolve calling them."""
    appcenter = live_server("appcenter", database_url=migrated_db_url)
    issuemanager = live_server("issuemanager", database_url=migrated_db_url)
    refresolve = start_refresolve(live_server, appcenter.address, issuemanager.address)
    return ReferenceSuite(appcenter, issuemanager, refresolve)


class FakeAppCenter(appcenter_pb2_grpc.AppCenterServiceServicer):
    """An AppCenter whose pages are scripted per container.

    ``pages[group_id or ""]`` is a list of ``(group_ids, file_paths)``; pages are chained
    with tokens ``"<n>"``. ``fail_on_call`` makes the n-th ListReferences call (1-based)
    fail with ``fail_code``; ``hang`` makes every call block until released.
    """

    def __init__(self, pages: dict[str, list[tuple[list[str], list[str]]]]) -> None:
        self.pages = pages
        self.calls = 0
        self.fail_on_call: int | None = None
        self.fail_code = grpc.StatusCode.UNAVAILABLE
        self.hang = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def LoadApps(  # noqa: N802 - generated name
        self, request: appcenter_pb2.LoadAppsRequest, context: grpc.ServicerContext
    ) -> appcenter_pb2.LoadAppsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake serves listings only")

    def DeleteApp(  # noqa: N802 - generated name
        self, request: appcenter_pb2.DeleteAppRequest, context: grpc.ServicerContext
    ) -> appcenter_pb2.DeleteAppResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the fake serves listings only")

    def ListReferences(  # noqa: N802 - generated name
        self, request: appcenter_pb2.ListReferencesRequest, context: grpc.ServicerContext
    ) -> appcenter_pb2.ListReferencesResponse:
        with self._lock:
            self.calls += 1
            call = self.calls
        if self.hang.is_set():
            self.release.wait(timeout=30)
        if self.fail_on_call is not None and call >= self.fail_on_call:
            context.abort(self.fail_code, "scripted failure")
        container = request.group_id if request.HasField("group_id") else ""
        if container not in self.pages:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such container")
        index = int(request.page_token or "0")
        groups, files = self.pages[container][index]
        more = index + 1 < len(self.pages[container])
        return appcenter_pb2.ListReferencesResponse(
            groups=[appcenter_pb2.ArtifactGroup(group_id=g, display_name=g) for g in groups],
            files=[
                appcenter_pb2.Artifact(path=p, display_name=p.rsplit("/", 1)[-1]) for p in files
            ],
            next_page_token=str(index + 1) if more else "",
        )


@pytest.fixture
def fake_appcenter() -> Iterator[Callable[[FakeAppCenter], str]]:
    """Serve a :class:`FakeAppCenter` on 127.0.0.1:0; returns its address."""
    servers: list[tuple[grpc.Server, FakeAppCenter]] = []

    def start(servicer: FakeAppCenter) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        appcenter_pb2_grpc.add_AppCenterServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append((server, servicer))
        return f"127.0.0.1:{port}"

    yield start
    for server, servicer in servers:
        servicer.release.set()
        server.stop(0).wait()
