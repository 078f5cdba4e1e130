"""Sessions through a real host server on both backends (HOST-SES-1/2/3/5/6)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from sqlalchemy import insert, update

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from store.engine import create_sync_engine_for
from store.models import Interaction, ResourceCleanupOutbox, Session, Turn
from tests.support.host_sessions import ADMIN, WS1, HostClient, error_of
from tests.support.servers import LiveServer, auth_metadata


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    client.register()
    return client


@pytest.mark.spec("HOST-SES-1", "HOST-SES-2")
def test_create_derives_provider_and_ref_and_reads_back(
    host: HostClient, migrated_db_url: str
) -> None:
    created = host.create(
        session_id="s-1",
        title="  First  ",
        provider="demo-provider",
        provider_target_ref="client://override-attempt",
        settings=canonical_pb2.SessionSettings(reasoning_effort="high"),
    )
    assert created.session_id == created.root_session_id == "s-1"
    assert created.agent_target_id == "demo"
    assert created.provider == "demo-provider"
    assert created.title == "First"
    assert created.rail_section_key == "conversations"
    assert not created.HasField("active_turn_id")
    assert created.capabilities.guidance
    # Normalized against the catalog: default model filled, requested effort kept.
    assert (created.settings.model, created.settings.reasoning_effort) == ("fast", "high")
    assert created.settings.permission_mode == "default"

    fetched = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-1")
    )
    assert fetched.session == created
    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                Session.__table__.select().where(Session.session_id == "s-1")
            ).one()
    finally:
        engine.dispose()
    # The runtime ref comes from the target, never from the client hint.
    assert row.provider_target_ref == "runtime://demo"
    assert row.launch_subagents_json is not None
    assert "explorer" in row.launch_subagents_json


@pytest.mark.spec("HOST-SES-1")
def test_target_is_required_resolved_and_enabled(host: HostClient) -> None:
    code, _, fields, _ = error_of(lambda: host.create(agent_target_id=""))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"agent_target_id"})
    code, reason, _, _ = error_of(lambda: host.create(agent_target_id="unknown"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_TARGET_UNAVAILABLE")
    host.call(
        "SetAgentTargetEnabled",
        host_pb2.SetAgentTargetEnabledRequest(agent_target_id="demo", enabled=False),
        ADMIN,
    )
    code, reason, _, _ = error_of(lambda: host.create())
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_TARGET_UNAVAILABLE")


@pytest.mark.spec("HOST-SES-1")
def test_a_malformed_stored_launch_ref_makes_the_target_unavailable(
    host: HostClient, migrated_db_url: str
) -> None:
    from store.models import AgentTarget

    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                update(AgentTarget)
                .where(AgentTarget.agent_target_id == "demo")
                .values(launch_ref_json='{"runtime_target_ref": ""}')
            )
    finally:
        engine.dispose()
    code, reason, _, _error = error_of(lambda: host.create())
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_TARGET_UNAVAILABLE")


@pytest.mark.spec("HOST-SES-1")
def test_a_different_provider_is_rejected(host: HostClient) -> None:
    code, reason, fields, _ = error_of(lambda: host.create(provider="someone-else"))
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "PROVIDER_MISMATCH",
        {"provider"},
    )


@pytest.mark.spec("HOST-SES-6", "SEC-2")
def test_create_settings_outside_the_catalog_are_rejected(host: HostClient) -> None:
    code, _, fields, _ = error_of(
        lambda: host.create(settings=canonical_pb2.SessionSettings(model="nope", speed=101))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == {"settings.model", "settings.speed"}


@pytest.mark.spec("HOST-SES-2")
def test_session_ids_are_idempotent_per_request_and_fenced_by_cleanup(
    host: HostClient, migrated_db_url: str
) -> None:
    first = host.create(session_id="s-1", title="T")
    assert host.create(session_id="s-1", title="T") == first  # identical retry
    code, reason, _, _ = error_of(lambda: host.create(session_id="s-1", cwd="/other"))
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "SESSION_ID_IN_USE")
    # The same id in another workspace is another Session.
    assert host.create("ws-2", session_id="s-1").workspace_id == "ws-2"

    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(ResourceCleanupOutbox).values(
                    workspace_id="ws-9", session_id="s-fenced", purged_at_unix_ms=1, reason="purge"
                )
            )
    finally:
        engine.dispose()
    code, reason, _, _error = error_of(lambda: host.create(session_id="s-fenced"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RESOURCE_CLEANUP_PENDING")


@pytest.mark.spec("HOST-SES-2")
def test_unbuilt_create_options_answer_unimplemented_and_write_nothing(host: HostClient) -> None:
    code, reason, _, _ = error_of(
        lambda: host.create(
            session_id="s-x",
            initial_goal=host_pb2.GoalSpec(objective="ship it"),
        )
    )
    assert (code, reason) == (grpc.StatusCode.UNIMPLEMENTED, "NOT_IMPLEMENTED")
    code, reason, _, _ = error_of(
        lambda: host.create(
            session_id="s-x",
            isolation=host_pb2.WorktreeIsolationRequest(mode=host_pb2.ISOLATION_MODE_WORKTREE),
        )
    )
    assert (code, reason) == (grpc.StatusCode.UNIMPLEMENTED, "NOT_IMPLEMENTED")
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-x")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


@pytest.mark.spec("HOST-SES-2", "HOST-PROJ-1")
def test_rail_section_key_placement(host: HostClient) -> None:
    host.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-app", label="App", path="/work/app"
        ),
    )
    inside = host.create(cwd="/work/app/src")
    assert (inside.rail_section_key, inside.rail_project_path) == ("p-app", "/work/app")
    sibling = host.create(cwd="/work/application")  # a prefix, not a containing path
    assert sibling.rail_section_key == "conversations"
    explicit = host.create(cwd="/srv/elsewhere", rail_section_key="p-app")
    assert explicit.rail_section_key == "p-app"
    chats = host.create(cwd="/work/app", rail_section_key="conversations")
    assert chats.rail_section_key == "conversations"
    code, reason, _, _ = error_of(lambda: host.create(rail_section_key="p-missing"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PROJECT_NOT_FOUND")
    # A later project list change never moves an existing Session (HOST-SES-2).
    host.call(
        "AddProject",
        host_pb2.AddProjectRequest(
            workspace_id="ws-1", section_key="p-src", label="Src", path="/work/app/src"
        ),
    )
    again = host.call(
        "GetSession",
        host_pb2.GetSessionRequest(workspace_id="ws-1", session_id=inside.session_id),
    )
    assert again.session.rail_section_key == "p-app"


def _seed_tree(url: str) -> None:
    """Children, Turns and Interactions under root ``s-1`` (written as a runtime would)."""
    engine = create_sync_engine_for(url)
    base = {
        "workspace_id": "ws-1",
        "provider": "demo-provider",
        "rail_section_key": "conversations",
        "root_session_id": "s-1",
        "agent_target_id": "demo",
    }
    try:
        with engine.begin() as connection:
            for sid, parent, created, deleted in (
                ("c-1", "s-1", 10, None),
                ("c-2", "s-1", 20, None),
                ("g-1", "c-1", 30, None),
                ("c-dead", "s-1", 40, 99),
            ):
                connection.execute(
                    insert(Session).values(
                        session_id=sid,
                        parent_session_id=parent,
                        created_at_unix_ms=created,
                        updated_at_unix_ms=created,
                        deleted_at_unix_ms=deleted,
                        deletion_generation="g" if deleted else None,
                        component_size=1 if deleted else None,
                        provider_resume_json='{"secret": "provider-private"}',
                        **base,
                    )
                )
            for tid, phase, created, retracted in (
                ("t-old", "settled", 1, None),
                ("t-active", "running", 5, None),
                ("t-retracted", "settled", 9, 9),
            ):
                connection.execute(
                    insert(Turn).values(
                        workspace_id="ws-1",
                        session_id="s-1",
                        turn_id=tid,
                        phase=phase,
                        outcome="completed" if phase == "settled" else None,
                        origin="user",
                        created_at_unix_ms=created,
                        updated_at_unix_ms=created,
                        retracted_at_unix_ms=retracted,
                    )
                )
            connection.execute(
                update(Session)
                .where(Session.workspace_id == "ws-1", Session.session_id == "s-1")
                .values(active_turn_id="t-active", message_version=7)
            )
            for rid, status, created in (("r-2", "pending", 3), ("r-1", "pending", 2)):
                connection.execute(
                    insert(Interaction).values(
                        workspace_id="ws-1",
                        session_id="s-1",
                        turn_id="t-active",
                        request_id=rid,
                        kind="permission",
                        status=status,
                        input_json="{}",
                        options_json='[{"option_id": "allow", "label": "Allow"}]',
                        occurred_at_unix_ms=created,
                        created_at_unix_ms=created,
                        updated_at_unix_ms=created,
                    )
                )
            connection.execute(
                insert(Interaction).values(
                    workspace_id="ws-1",
                    session_id="s-1",
                    turn_id="t-old",
                    request_id="r-done",
                    kind="question",
                    status="answered",
                    occurred_at_unix_ms=1,
                    created_at_unix_ms=1,
                    updated_at_unix_ms=1,
                )
            )
    finally:
        engine.dispose()


@pytest.mark.spec("HOST-SES-3")
def test_get_session_is_canonical_truth(host: HostClient, migrated_db_url: str) -> None:
    host.create(session_id="s-1", title="Root")
    _seed_tree(migrated_db_url)
    detail = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-1")
    )
    assert detail.session.active_turn_id == "t-active"
    assert detail.session.message_version == 7
    assert detail.active_turn.turn_id == "t-active"
    assert detail.active_turn.phase == canonical_pb2.TURN_PHASE_RUNNING
    # latest_turn is the newest *effective* Turn, independent of active_turn.
    assert detail.latest_turn.turn_id == "t-active"
    assert [i.request_id for i in detail.pending_interactions] == ["r-1", "r-2"]
    assert detail.pending_interactions[0].options[0].option_id == "allow"
    # Live descendants as full entities, parents before children; tombstones left out.
    assert [c.session_id for c in detail.children] == ["c-1", "c-2", "g-1"]
    assert detail.children[2].parent_session_id == "c-1"
    assert detail.children[0].rail_section_key == "conversations"
    assert b"provider-private" not in detail.SerializeToString()
    assert not detail.HasField("goal")

    child = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="c-1")
    )
    assert [c.session_id for c in child.children] == ["g-1"]
    assert list(child.pending_interactions) == []
    assert not child.HasField("active_turn")
    assert not child.HasField("latest_turn")

    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="c-dead")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_DELETED")
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-404")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


@pytest.mark.spec("HOST-SES-3", "CON-4")
def test_a_message_version_above_the_cursor_bound_fails_the_response(
    host: HostClient, migrated_db_url: str
) -> None:
    host.create(session_id="s-1")
    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                update(Session).where(Session.session_id == "s-1").values(message_version=2**53)
            )
    finally:
        engine.dispose()
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-1")
        )
    )
    assert (code, reason) == (grpc.StatusCode.OUT_OF_RANGE, "CURSOR_BOUND_EXCEEDED")


@pytest.mark.spec("HOST-SES-3", "SEC-1")
def test_sessions_of_another_workspace_are_invisible(host: HostClient) -> None:
    host.create("ws-2", session_id="s-2")
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-2", session_id="s-2")
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "WORKSPACE_SCOPE_MISMATCH")
    code, reason, _, _ = error_of(
        lambda: host.call(
            "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-2")
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


@pytest.mark.spec("HOST-SES-5")
def test_rename_and_pin_return_the_authoritative_session(host: HostClient) -> None:
    created = host.create(session_id="s-1", title="Old")
    renamed = host.call(
        "RenameSession",
        host_pb2.RenameSessionRequest(workspace_id="ws-1", session_id="s-1", title=" New "),
    ).session
    assert renamed.title == "New"
    assert renamed.updated_at_unix_ms == created.updated_at_unix_ms  # no rail reordering
    code, _, fields, _ = error_of(
        lambda: host.call(
            "RenameSession",
            host_pb2.RenameSessionRequest(workspace_id="ws-1", session_id="s-1", title="  "),
        )
    )
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"title"})
    code, _, fields, _ = error_of(
        lambda: host.call(
            "RenameSession",
            host_pb2.RenameSessionRequest(workspace_id="ws-1", session_id="s-1", title="x" * 513),
        )
    )
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"title"})

    pinned = host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="s-1", pinned=True),
    ).session
    assert pinned.HasField("pinned_at_unix_ms")
    again = host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="s-1", pinned=True),
    ).session
    assert again.pinned_at_unix_ms == pinned.pinned_at_unix_ms
    unpinned = host.call(
        "SetSessionPinned",
        host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="s-1", pinned=False),
    ).session
    assert not unpinned.HasField("pinned_at_unix_ms")
    assert unpinned.title == "New"


@pytest.mark.spec("HOST-SES-6")
def test_settings_are_validated_normalized_persisted_and_reported(host: HostClient) -> None:
    host.create(session_id="s-1", settings=canonical_pb2.SessionSettings(reasoning_effort="high"))

    def update_settings(**fields: object) -> host_pb2.UpdateSessionSettingsResponse:
        response: host_pb2.UpdateSessionSettingsResponse = host.call(
            "UpdateSessionSettings",
            host_pb2.UpdateSessionSettingsRequest(
                workspace_id="ws-1",
                session_id="s-1",
                settings=canonical_pb2.SessionSettings(**fields),  # type: ignore[arg-type]
            ),
        )
        return response

    changed = update_settings(permission_mode="accept_edits", speed=40)
    assert changed.session.settings == canonical_pb2.SessionSettings(
        model="fast", reasoning_effort="high", permission_mode="accept_edits", speed=40
    )
    assert changed.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_NOT_ATTACHED
    # Switching to a model without efforts drops the stale effort (normalization).
    plain = update_settings(model="plain")
    assert plain.session.settings == canonical_pb2.SessionSettings(
        model="plain", permission_mode="accept_edits", speed=40
    )
    code, _, fields, _ = error_of(lambda: update_settings(reasoning_effort="high"))
    assert (code, fields) == (grpc.StatusCode.INVALID_ARGUMENT, {"settings.reasoning_effort"})
    code, _, fields, _ = error_of(lambda: update_settings(permission_mode="yolo", speed=-1))
    assert fields == {"settings.permission_mode", "settings.speed"}
    read = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-1")
    )
    assert read.session.settings == plain.session.settings  # rejected updates changed nothing


@pytest.mark.spec("HOST-SES-6")
def test_settings_of_a_session_whose_target_is_gone_cannot_be_validated(
    host: HostClient, migrated_db_url: str
) -> None:
    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                insert(Session).values(
                    workspace_id="ws-1",
                    session_id="legacy",
                    root_session_id="legacy",
                    provider="old-provider",
                    rail_section_key="conversations",
                    created_at_unix_ms=1,
                    updated_at_unix_ms=1,
                )
            )
    finally:
        engine.dispose()
    code, reason, _, _ = error_of(
        lambda: host.call(
            "UpdateSessionSettings",
            host_pb2.UpdateSessionSettingsRequest(
                workspace_id="ws-1",
                session_id="legacy",
                settings=canonical_pb2.SessionSettings(model="fast"),
            ),
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_TARGET_UNAVAILABLE")
    # A provider-only historical Session still reads fine (HOST-SES-1).
    read = host.call(
        "GetSession",
        host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="legacy"),
        auth_metadata("admin"),
    )
    assert read.session.agent_target_id == ""
    assert read.session.provider == "old-provider"


@pytest.mark.spec("HOST-SES-5", "HOST-SES-6")
def test_mutations_of_a_tombstoned_session_are_typed_not_found(
    host: HostClient, migrated_db_url: str
) -> None:
    host.create(session_id="s-1")
    engine = create_sync_engine_for(migrated_db_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                update(Session)
                .where(Session.session_id == "s-1")
                .values(deleted_at_unix_ms=5, deletion_generation="g", component_size=1)
            )
    finally:
        engine.dispose()
    for method, request in (
        (
            "RenameSession",
            host_pb2.RenameSessionRequest(workspace_id="ws-1", session_id="s-1", title="x"),
        ),
        (
            "SetSessionPinned",
            host_pb2.SetSessionPinnedRequest(workspace_id="ws-1", session_id="s-1", pinned=True),
        ),
        (
            "UpdateSessionSettings",
            host_pb2.UpdateSessionSettingsRequest(workspace_id="ws-1", session_id="s-1"),
        ),
    ):
        code, reason, _, _ = error_of(lambda m=method, r=request: host.call(m, r, WS1))  # type: ignore[misc]
        assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_DELETED"), method
