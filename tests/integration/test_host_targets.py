"""Agent targets through a real host server on both backends (HOST-TGT-1)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from agentactivity.host.v1 import host_pb2
from tests.support.host_sessions import ADMIN, WS1, HostClient, demo_target, error_of
from tests.support.servers import LiveServer, auth_metadata


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    return HostClient(live_server("host", database_url=migrated_db_url))


@pytest.mark.spec("HOST-TGT-1")
def test_register_list_and_replace_a_target(host: HostClient) -> None:
    first = host.call(
        "RegisterAgentTarget", host_pb2.RegisterAgentTargetRequest(target=demo_target()), ADMIN
    )
    assert first.created
    stored = first.target
    assert stored.launch_ref.runtime_target_ref == "runtime://demo"
    assert stored.launch_ref.options_json == '{"x": 1}'  # verbatim
    assert [s.name for s in stored.subagents] == ["explorer"]
    assert stored.capabilities.guidance
    assert not stored.capabilities.live_settings
    assert stored.settings_catalog.default_model_id == "fast"
    assert stored.locality == host_pb2.AGENT_TARGET_LOCALITY_LOCAL
    assert stored.created_at_unix_ms > 0

    replaced = host.call(
        "RegisterAgentTarget",
        host_pb2.RegisterAgentTargetRequest(target=demo_target(display_name="Renamed")),
        auth_metadata("service"),
    )
    assert not replaced.created
    assert replaced.target.display_name == "Renamed"
    assert replaced.target.created_at_unix_ms == stored.created_at_unix_ms

    host.register(demo_target("other", provider="open-vocabulary-provider"))
    listed = host.call("ListAgentTargets", host_pb2.ListAgentTargetsRequest())
    assert [t.agent_target_id for t in listed.targets] == ["demo", "other"]
    assert listed.targets[1].provider == "open-vocabulary-provider"  # CON-6: kept verbatim
    only = host.call(
        "ListAgentTargets", host_pb2.ListAgentTargetsRequest(provider="open-vocabulary-provider")
    )
    assert [t.agent_target_id for t in only.targets] == ["other"]


@pytest.mark.spec("HOST-TGT-1", "SEC-1")
def test_only_service_or_admin_may_register_or_enable(host: HostClient) -> None:
    code, reason, _, _ = error_of(
        lambda: host.call(
            "RegisterAgentTarget", host_pb2.RegisterAgentTargetRequest(target=demo_target()), WS1
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    host.register()
    code, reason, _, _ = error_of(
        lambda: host.call(
            "SetAgentTargetEnabled",
            host_pb2.SetAgentTargetEnabledRequest(agent_target_id="demo", enabled=False),
            WS1,
        )
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")


@pytest.mark.spec("HOST-TGT-1", "SEC-2", "CON-5")
def test_malformed_targets_are_rejected_with_field_violations(host: HostClient) -> None:
    bad = demo_target()
    bad.launch_ref.runtime_target_ref = ""
    bad.launch_ref.options_json = "[1]"
    bad.subagents.add(name="explorer")
    bad.subagents.add(name="bad name")
    bad.settings_catalog.default_model_id = "missing"
    code, reason, fields, _ = error_of(
        lambda: host.call(
            "RegisterAgentTarget", host_pb2.RegisterAgentTargetRequest(target=bad), ADMIN
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert reason == "INVALID_ARGUMENT"
    assert {
        "target.launch_ref.runtime_target_ref",
        "target.subagents[1].name",
        "target.subagents[2].name",
        "target.settings_catalog.default_model_id",
    } <= fields
    listed = host.call(
        "ListAgentTargets", host_pb2.ListAgentTargetsRequest(include_disabled=True), ADMIN
    )
    assert list(listed.targets) == []  # a bad request never changes state


@pytest.mark.spec("HOST-TGT-1", "SEC-2")
def test_an_unknown_locality_is_refused_at_the_edge(host: HostClient) -> None:
    bad = demo_target()
    bad.locality = 42  # type: ignore[assignment]  # an unknown enum number on the wire
    code, reason, fields, _ = error_of(
        lambda: host.call(
            "RegisterAgentTarget", host_pb2.RegisterAgentTargetRequest(target=bad), ADMIN
        )
    )
    # Refused by the generic enum check before the handler (grpcserver.request_checks).
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        {"target.locality"},
    )
    listed = host.call(
        "ListAgentTargets", host_pb2.ListAgentTargetsRequest(include_disabled=True), ADMIN
    )
    assert list(listed.targets) == []


@pytest.mark.spec("HOST-TGT-1")
def test_a_target_cannot_change_provider(host: HostClient) -> None:
    host.register()
    code, reason, _, _ = error_of(
        lambda: host.call(
            "RegisterAgentTarget",
            host_pb2.RegisterAgentTargetRequest(target=demo_target(provider="another")),
            ADMIN,
        )
    )
    assert (code, reason) == (grpc.StatusCode.ALREADY_EXISTS, "PROVIDER_MISMATCH")


@pytest.mark.spec("HOST-TGT-1")
def test_disabling_hides_the_target_unless_asked(host: HostClient) -> None:
    host.register()
    disabled = host.call(
        "SetAgentTargetEnabled",
        host_pb2.SetAgentTargetEnabledRequest(agent_target_id="demo", enabled=False),
        ADMIN,
    )
    assert not disabled.target.enabled
    assert list(host.call("ListAgentTargets", host_pb2.ListAgentTargetsRequest()).targets) == []
    everything = host.call(
        "ListAgentTargets", host_pb2.ListAgentTargetsRequest(include_disabled=True)
    )
    assert [t.enabled for t in everything.targets] == [False]
    code, reason, _, _ = error_of(
        lambda: host.call(
            "SetAgentTargetEnabled",
            host_pb2.SetAgentTargetEnabledRequest(agent_target_id="nope", enabled=True),
            ADMIN,
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "AGENT_TARGET_NOT_FOUND")
