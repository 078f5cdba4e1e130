"""The demo runtime creates a Session's resources when a Turn starts, through a real Host and a
real demo runtime process wiring, on SQLite and Postgres (MAINT-OUT-1).

The four resources are the ones maintenance releases after a purge (``session_resources``):
the sidecar state and copied attachments keyed by Session id, the workspace scratch directory
and the global agent lease. Deleting the Session (``release_session``) keeps them all; the
manual purge through a real maintenance server releases them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from services.demoruntime.resources import attachment_file_name
from session_resources import ResourceLayout
from store.models import RuntimeCommandOutbox
from tests.support.polling import eventually
from tests.support.servers import LiveServer, auth_metadata, token_for

WS = "ws-1"
SID = "s-res"
DEVICE = auth_metadata("ws1-device")
CWD = "/nonexistent/managed-worktree"


def _reference(ref_id: str, destination: str) -> canonical_pb2.ReferenceMeta:
    return canonical_pb2.ReferenceMeta(
        id=ref_id,
        kind="workspace_file",
        destination=destination,
        filename=destination.rsplit("/", 1)[-1],
        mime="text/plain",
        size_bytes=42,
        provenance=canonical_pb2.ReferenceProvenance(
            source="composer.paste", created_at="2026-11-06T10:15:00Z", trust="user"
        ),
        actions=["open"],
    )


def _settled(stub: host_pb2_grpc.HostServiceStub, turn_id: str) -> bool:
    turns = stub.ListSessionTurns(
        host_pb2.ListSessionTurnsRequest(workspace_id=WS, session_id=SID), metadata=DEVICE
    ).turns
    return any(
        t.turn_id == turn_id
        and t.phase == canonical_pb2.TURN_PHASE_SETTLED
        and t.outcome == canonical_pb2.TURN_OUTCOME_COMPLETED
        for t in turns
    )


def _read(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(path.read_text())
    return value


def _pending_releases(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(RuntimeCommandOutbox.session_id).where(
                RuntimeCommandOutbox.command_kind == "release_session"
            )
        ).all()
    return [str(row[0]) for row in rows]


@pytest.mark.slow
@pytest.mark.spec("MAINT-OUT-1", "HOST-RT-1", "HOST-CLEAN-1")
def test_a_demo_turn_creates_the_four_resources_a_delete_keeps_them_a_purge_releases_them(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    tmp_path: Path,
) -> None:
    host = live_server("host", database_url=migrated_db_url)
    root = tmp_path / "resources"
    live_server(
        "demoruntime",
        host_address=host.address,
        service_token=token_for("service"),
        demo_step_delay_seconds=0.0,
        resources_dir=root,
    )
    layout = ResourceLayout(root)
    stub = host_pb2_grpc.HostServiceStub(host.channel)
    first_ref = _reference("ref-1", "src/login.py")
    created = stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_target_id="demo",
            session_id=SID,
            title="resources",
            cwd=CWD,
            initial_input=host_pb2.InitialInput(
                client_submit_id="c1", content="hello", references=[first_ref]
            ),
        ),
        metadata=DEVICE,
    )
    first_turn = created.turn.turn_id
    assert eventually(lambda: _settled(stub, first_turn), timeout=30)

    # A second Turn with a reference whose id is no safe file name: its copy is hashed.
    odd_ref = _reference("../../escape/ref 2", "docs/plan.md")
    second_turn = stub.SendInput(
        host_pb2.SendInputRequest(
            workspace_id=WS,
            session_id=SID,
            client_submit_id="c2",
            delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
            mode=canonical_pb2.COMPOSER_MODE_AGENT,
            content="and the plan",
            references=[odd_ref],
        ),
        metadata=DEVICE,
    ).turn.turn_id
    assert eventually(lambda: _settled(stub, second_turn), timeout=30)

    state = _read(layout.sidecar_dir(SID) / "state.json")
    assert (state["workspace_id"], state["session_id"], state["turn_id"]) == (
        WS,
        SID,
        second_turn,
    )
    assert state["updated_at"].endswith("Z")

    copies = sorted(p.name for p in layout.attachments_dir(SID).iterdir())
    assert copies == sorted([attachment_file_name("ref-1"), attachment_file_name(odd_ref.id)])
    first_copy = _read(layout.attachments_dir(SID) / attachment_file_name("ref-1"))
    assert first_copy == {
        "id": "ref-1",
        "kind": "workspace_file",
        "destination": "src/login.py",
        "filename": "login.py",
        "mime": "text/plain",
        "size_bytes": "42",
        "provenance": {
            "source": "composer.paste",
            "created_at": "2026-11-06T10:15:00Z",
            "trust": "user",
        },
        "actions": ["open"],
    }
    assert _read(layout.attachments_dir(SID) / attachment_file_name(odd_ref.id))["id"] == (
        odd_ref.id
    )
    assert not (tmp_path / "escape").exists()

    scratch = _read(layout.workspace_dir(WS, SID) / "scratch.json")
    assert (scratch["turn_id"], scratch["cwd"]) == (second_turn, CWD)
    lease = _read(layout.agent_lease(SID) / "lease.json")
    assert (lease["workspace_id"], lease["session_id"], lease["turn_id"]) == (
        WS,
        SID,
        second_turn,
    )
    # Every file is complete JSON: no temporary file is left behind.
    leftovers = [p for p in root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    assert not Path(CWD).exists()  # the Session's cwd is recorded, never created

    # Deleting the Session releases it at the runtime, which keeps every resource on disk
    # (the Session is restorable; maintenance releases them after the purge).
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=[SID]), metadata=DEVICE
    )
    assert eventually(lambda: not _pending_releases(sync_engine), timeout=30), (
        "the demo runtime never acknowledged release_session"
    )
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before

    # The manual purge removes the Session and maintenance releases all four resources.
    maintenance = live_server(
        "maintenance",
        database_url=migrated_db_url,
        host_address=host.address,
        service_token=token_for("service"),
        resources_dir=root,
    )
    purged = maintenance_pb2_grpc.MaintenanceServiceStub(maintenance.channel).RunManualPurge(
        maintenance_pb2.RunManualPurgeRequest(
            workspace_id=WS, scope=maintenance_pb2.PURGE_SCOPE_COMPONENT, session_id=SID
        ),
        metadata=auth_metadata("admin"),
        timeout=60,
    )
    assert list(purged.purged_session_ids) == [SID]
    assert purged.run.cleanup.completed == 1
    for gone in (
        layout.sidecar_dir(SID),
        layout.attachments_dir(SID),
        layout.workspace_dir(WS, SID),
        layout.agent_lease(SID),
    ):
        assert not gone.exists(), gone
