"""Session settings applied to a connected runtime over the runtime link (HOST-SES-6).

A real host and a scripted runtime, both backends: ``UpdateSessionSettings`` persists, sends
``apply_settings`` and reports the runtime's verdict (applied, or failed with the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, runtime_pb2
from tests.support.host_sessions import HostClient, demo_target
from tests.support.runtime_client import ScriptedRuntime
from tests.support.servers import LiveServer


def _host(
    live_server: Callable[..., LiveServer], url: str, *, live: bool = True, **overrides: object
) -> tuple[HostClient, LiveServer]:
    server = live_server("host", database_url=url, **overrides)
    client = HostClient(server)
    target = demo_target()
    target.capabilities.live_settings = live
    client.register(target)
    client.create(session_id="s-1")
    return client, server


def _update(host: HostClient, **fields: object) -> host_pb2.UpdateSessionSettingsResponse:
    response: host_pb2.UpdateSessionSettingsResponse = host.call(
        "UpdateSessionSettings",
        host_pb2.UpdateSessionSettingsRequest(
            workspace_id="ws-1",
            session_id="s-1",
            settings=canonical_pb2.SessionSettings(**fields),  # type: ignore[arg-type]
        ),
    )
    return response


def _ack(
    runtime: ScriptedRuntime,
    command_id: str,
    status: runtime_pb2.CommandAckStatus.ValueType,
    message: str | None = None,
) -> None:
    ack = runtime_pb2.CommandAck(command_id=command_id, status=status)
    if message is not None:
        ack.message = message
    runtime.send(runtime_pb2.RuntimeLinkRequest(command_ack=ack))


@pytest.mark.spec("HOST-SES-6", "HOST-RT-1")
def test_settings_are_applied_to_the_connected_runtime(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host, server = _host(live_server, migrated_db_url)
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    with ThreadPoolExecutor(1) as pool:
        pending: Future[host_pb2.UpdateSessionSettingsResponse] = pool.submit(
            _update, host, model="plain", speed=30
        )
        command = runtime.next_command()
        assert command.WhichOneof("command") == "apply_settings"
        assert command.session_id == "s-1"
        # The complete normalized settings, as persisted.
        assert command.apply_settings.settings == canonical_pb2.SessionSettings(
            model="plain", permission_mode="default", speed=30
        )
        assert not pending.done()  # the update waits for the runtime's verdict
        runtime.ack(command.command_id)
        applied = pending.result(timeout=10)
    assert applied.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_APPLIED
    assert not applied.runtime_application.HasField("failure_message")
    assert applied.session.settings.model == "plain"
    runtime.close()


@pytest.mark.spec("HOST-SES-6", "HOST-RT-1")
def test_a_runtime_rejection_is_reported_and_the_settings_stay_persisted(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host, server = _host(live_server, migrated_db_url)
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_update, host, model="plain")
        command = runtime.next_command()
        _ack(
            runtime,
            command.command_id,
            runtime_pb2.COMMAND_ACK_STATUS_REJECTED,
            "model not available on this account",
        )
        failed = pending.result(timeout=10)
    application = failed.runtime_application
    assert application.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "model not available on this account" in application.failure_message
    read = host.call(
        "GetSession", host_pb2.GetSessionRequest(workspace_id="ws-1", session_id="s-1")
    )
    assert read.session.settings.model == "plain"
    runtime.close()


@pytest.mark.spec("HOST-SES-6")
def test_a_runtime_that_never_acknowledges_is_reported_failed(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host, server = _host(live_server, migrated_db_url, runtime_command_timeout_seconds=0.3)
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    failed = _update(host, model="plain")
    assert failed.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_FAILED
    assert "did not acknowledge" in failed.runtime_application.failure_message
    assert runtime.next_command().WhichOneof("command") == "apply_settings"
    runtime.close()


@pytest.mark.spec("HOST-SES-6")
def test_without_live_settings_the_runtime_is_not_asked(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host, server = _host(live_server, migrated_db_url, live=False)
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    deferred = _update(host, model="plain")
    assert deferred.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_DEFERRED
    assert runtime.commands.empty()
    runtime.close()
    # With no runtime serving the target the settings apply at the next start.
    detached = _update(host, model="fast")
    assert detached.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_NOT_ATTACHED


@pytest.mark.spec("HOST-SES-6", "HOST-LANE-1", "HOST-RT-5")
def test_a_report_sent_before_the_ack_applies_and_the_settings_are_applied(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    # The runtime reports on the Session before it acknowledges the settings: the report
    # applies while the update waits in the Session's lane (it used to wait for the lane, and
    # the update for the ack behind it, until the timeout).
    host, server = _host(live_server, migrated_db_url, runtime_command_timeout_seconds=5)
    runtime = ScriptedRuntime(server.channel, providers=("demo-provider",))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_update, host, model="plain")
        command = runtime.next_command()
        assert command.WhichOneof("command") == "apply_settings"
        started = time.monotonic()
        runtime.send_report(
            "ws-1",
            "s-1",
            "before-ack",
            runtime_pb2.ReportItem(
                session_patch=runtime_pb2.SessionPatch(provider_session_ref="p-1")
            ),
        )
        runtime.ack(command.command_id)
        applied = pending.result(timeout=10)
    assert time.monotonic() - started < 4  # not the timeout
    assert runtime.result("before-ack").outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    assert applied.runtime_application.status == host_pb2.RUNTIME_SETTINGS_STATUS_APPLIED
    runtime.close()
