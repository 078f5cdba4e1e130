"""A real Host and a real maintenance server on one store, with a fake maintenance clock.

Trees are written to the store with :mod:`tests.support.session_trees` and tombstoned through
Host's ``DeleteSessions`` (so each gets a real generation and ``deleted_at``); maintenance talks
to Host over gRPC with the deployment-wide ``service`` token, exactly as in production. The
maintenance clock starts 40 days after the real one, so every tombstone is past retention.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, update

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from services.maintenance.app import Maintenance, definition_for_parts
from services.maintenance.host_port import GrpcHost, HostPort
from services.maintenance.lease import WorkerLease
from session_resources.layout import ResourceLayout
from store.models import Session, Turn
from tests.support.fake_clock import FakeClock
from tests.support.servers import LiveServer, auth_metadata, token_for
from tests.support.session_trees import add_active_turn, add_tree

__all__ = ["MaintenanceUnderTest", "Stack", "fake_clock", "stack"]

DAY_S = 24 * 3600
ACTIVE = ("queued", "running", "awaiting_interaction")
START_OFFSET_MS = 40 * DAY_S * 1000


@dataclass
class MaintenanceUnderTest:
    """One started maintenance server and a handle on its parts."""

    server: LiveServer
    parts: Maintenance
    stub: Any

    def call(self, method: str, request: Any, principal: str = "admin", **kwargs: Any) -> Any:
        """Call a MaintenanceService RPC as ``principal``."""
        return getattr(self.stub, method)(request, metadata=auth_metadata(principal), **kwargs)

    def status(self, principal: str = "admin", **fields: Any) -> Any:
        """``GetMaintenanceStatus``."""
        return self.call(
            "GetMaintenanceStatus", maintenance_pb2.GetMaintenanceStatusRequest(**fields), principal
        )

    def purge(self, workspace_id: str, session_id: str | None = None, **fields: Any) -> Any:
        """``RunManualPurge`` of a workspace or one component."""
        scope = (
            maintenance_pb2.PURGE_SCOPE_WORKSPACE
            if session_id is None
            else maintenance_pb2.PURGE_SCOPE_COMPONENT
        )
        request = maintenance_pb2.RunManualPurgeRequest(
            workspace_id=workspace_id, scope=scope, **fields
        )
        if session_id is not None:
            request.session_id = session_id
        return self.call("RunManualPurge", request, timeout=60)


@dataclass
class Stack:
    """Host plus maintenance on one store."""

    engine: Engine
    host: LiveServer
    resources: Path
    start_server: Callable[..., LiveServer]
    host_stub: Any = field(init=False)

    def __post_init__(self) -> None:
        self.host_stub = host_pb2_grpc.HostServiceStub(self.host.channel)

    def tombstone(self, parents: Mapping[str, str | None], workspace_id: str = "ws-1") -> list[str]:
        """Write the trees and delete their roots through Host; returns the roots."""
        add_tree(self.engine, parents, workspace_id=workspace_id)
        roots = [sid for sid, parent in parents.items() if parent is None]
        self.host_stub.DeleteSessions(
            host_pb2.DeleteSessionsRequest(workspace_id=workspace_id, session_ids=roots),
            metadata=auth_metadata("admin"),
        )
        return roots

    def create_resources(self, workspace_id: str, session_id: str) -> ResourceLayout:
        """Create the four resources a runtime creates for a Session (MAINT-OUT-1)."""
        layout = ResourceLayout(self.resources)
        for directory in (
            layout.sidecar_dir(session_id),
            layout.attachments_dir(session_id),
            layout.workspace_dir(workspace_id, session_id),
            layout.agent_lease(session_id),
        ):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "state.json").write_text("{}")
        return layout

    def resource_classes(self, workspace_id: str, session_id: str) -> set[str]:
        """Which resource classes of a Session still exist on disk."""
        layout = ResourceLayout(self.resources)
        present = set()
        if layout.sidecar_dir(session_id).exists() or layout.attachments_dir(session_id).exists():
            present.add("session")
        if layout.workspace_dir(workspace_id, session_id).exists():
            present.add("workspace")
        if layout.agent_lease(session_id).exists():
            present.add("agent_lease")
        return present

    def pending_cleanups(self) -> set[tuple[str, str]]:
        """(workspace, Session) of Host's pending cleanup rows."""
        response = self.host_stub.ListPendingResourceCleanups(
            host_pb2.ListPendingResourceCleanupsRequest(limit=1000),
            metadata=auth_metadata("service"),
        )
        return {(row.workspace_id, row.session_id) for row in response.cleanups}

    def start_turn(self, session_id: str, turn_id: str, workspace_id: str = "ws-1") -> None:
        """Make a live Session's Turn active (the idle gate closes)."""
        add_active_turn(self.engine, session_id, turn_id, workspace_id=workspace_id)

    def settle_turns(self) -> None:
        """End every active Turn (the idle gate opens)."""
        with self.engine.begin() as connection:
            connection.execute(
                update(Turn)
                .where(Turn.phase.in_(ACTIVE))
                .values(phase="settled", outcome="canceled")
            )
            connection.execute(update(Session).values(active_turn_id=None))

    def maintenance(
        self,
        clock: FakeClock,
        *,
        wrap: Callable[[HostPort], HostPort] | None = None,
        lease: WorkerLease | None = None,
        **overrides: Any,
    ) -> MaintenanceUnderTest:
        """Start a maintenance server on ``clock`` (``wrap`` intercepts its Host calls;
        ``lease`` replaces the worker lease the store would choose)."""
        built: list[Maintenance] = []

        def build(settings: Any) -> Any:
            host: HostPort = GrpcHost(settings, settings.maintenance_host_timeout_seconds)
            parts = Maintenance(
                settings, clock=clock, host=wrap(host) if wrap is not None else host, lease=lease
            )
            built.append(parts)
            return definition_for_parts(parts)

        settings: dict[str, Any] = {
            "host_address": self.host.address,
            "service_token": token_for("service"),
            "resources_dir": self.resources,
            **overrides,
        }
        server = self.start_server("maintenance", build=build, **settings)
        return MaintenanceUnderTest(
            server, built[0], maintenance_pb2_grpc.MaintenanceServiceStub(server.channel)
        )


def fake_clock() -> FakeClock:
    """A clock 40 days ahead of real time (every tombstone is past retention)."""
    return FakeClock(time.time_ns() // 1_000_000 + START_OFFSET_MS)


@pytest.fixture
def stack(
    migrated_db_url: str,
    sync_engine: Engine,
    live_server: Callable[..., LiveServer],
    tmp_path: Path,
) -> Stack:
    """A Host server on the test store, ready for maintenance servers."""
    host = live_server("host", database_url=migrated_db_url)

    def start(name: str, **overrides: Any) -> LiveServer:
        return live_server(name, database_url=migrated_db_url, **overrides)

    return Stack(sync_engine, host, tmp_path / "resources", start)
