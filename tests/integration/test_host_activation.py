"""ActivateSession (HOST-SES-9) through a real host and a scripted runtime, on both backends."""

from __future__ import annotations

import concurrent.futures
import queue
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from agentactivity.host.v1 import host_pb2, runtime_pb2
from store.models import HostOperation, RuntimeCommandOutbox, Turn
from tests.integration.host_activity import DEVICE, WS, HostUnderTest, error_reason, start_host
from tests.support.runtime_client import ScriptedRuntime
from tests.support.servers import LiveServer

ACCEPTED = runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
REJECTED = runtime_pb2.COMMAND_ACK_STATUS_REJECTED


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def activate(
    host: HostUnderTest, activation_id: str, session_id: str = "s1"
) -> host_pb2.ActivateSessionResponse:
    response: host_pb2.ActivateSessionResponse = host.stub.ActivateSession(
        host_pb2.ActivateSessionRequest(
            workspace_id=WS, session_id=session_id, activation_id=activation_id
        ),
        metadata=DEVICE,
        timeout=15,
    )
    return response


def get_session(host: HostUnderTest, session_id: str = "s1") -> host_pb2.GetSessionResponse:
    response: host_pb2.GetSessionResponse = host.stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id=session_id), metadata=DEVICE
    )
    return response


def rows(engine: Engine, model: type) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(model)).scalar_one())


def with_resume_identity(runtime: ScriptedRuntime, ref: str) -> None:
    """The runtime reports the provider resume identity Host stores for ``s1``."""
    runtime.report(
        WS,
        "s1",
        f"resume-{ref}",
        runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(provider_session_ref=ref)),
    )


def no_command(runtime: ScriptedRuntime, wait: float = 0.5) -> bool:
    try:
        runtime.next_command(timeout=wait)
    except queue.Empty:
        return True
    return False


def sent_kinds(runtime: ScriptedRuntime, wait: float = 0.5) -> list[str | None]:
    """The kinds of every command Host sends within ``wait`` seconds."""
    kinds: list[str | None] = []
    while True:
        try:
            kinds.append(runtime.next_command(timeout=wait).WhichOneof("command"))
        except queue.Empty:
            return kinds


@pytest.mark.spec("HOST-SES-9", "HOST-RT-5", "HOST-SES-3")
def test_activation_sends_resume_once_waits_for_the_ack_and_returns_the_aggregate(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    with_resume_identity(runtime, "provider-session-7")
    pending = pool.submit(activate, host, "act-1")
    command = runtime.next_command()
    assert command.WhichOneof("command") == "resume_session"
    assert command.session_id == "s1"
    context = command.resume_session.session
    assert context.provider_session_ref == "provider-session-7"
    assert context.runtime_target_ref == "demo:default"
    assert context.cwd == "/nonexistent/workspace"
    time.sleep(0.3)
    assert not pending.done()  # the call waits for the acknowledgement
    runtime.ack(command.command_id, ACCEPTED)
    activated = pending.result(timeout=10)

    assert not activated.replayed
    assert activated.detail == get_session(host)
    assert activated.detail.session.session_id == "s1"
    assert not activated.detail.HasField("active_turn")
    assert rows(sync_engine, Turn) == 0  # no Turn started
    assert rows(sync_engine, HostOperation) == 1
    assert no_command(runtime)

    # A replay sends nothing and returns the current aggregate.
    host.stub.RenameSession(
        host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title="renamed"),
        metadata=DEVICE,
    )
    replay = activate(host, "act-1")
    assert replay.replayed
    assert replay.detail == get_session(host)
    assert replay.detail.session.title == "renamed"
    assert no_command(runtime)
    assert rows(sync_engine, HostOperation) == 1

    # Another activation id is another activation.
    again = pool.submit(activate, host, "act-2")
    second = runtime.next_command()
    assert second.WhichOneof("command") == "resume_session"
    assert second.command_id != command.command_id
    runtime.ack(second.command_id, ACCEPTED)
    assert not again.result(timeout=10).replayed
    assert rows(sync_engine, HostOperation) == 2
    assert rows(sync_engine, RuntimeCommandOutbox) == 0
    runtime.close()


@pytest.mark.spec("HOST-SES-9", "HOST-RT-1")
def test_activation_without_a_runtime_is_unavailable_and_writes_nothing(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    before = get_session(host)
    with pytest.raises(grpc.RpcError) as caught:
        activate(host, "act-1")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(caught.value) == "RUNTIME_UNAVAILABLE"
    assert rows(sync_engine, RuntimeCommandOutbox) == 0
    assert rows(sync_engine, HostOperation) == 0
    assert get_session(host) == before


@pytest.mark.spec("HOST-SES-9")
def test_a_tombstoned_or_unknown_session_is_not_found(
    migrated_db_url: str, live_server: Callable[..., LiveServer], sync_engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    with pytest.raises(grpc.RpcError) as unknown:
        activate(host, "act-1", session_id="nope")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(unknown.value) == "SESSION_NOT_FOUND"
    host.stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id=WS, session_ids=["s1"]), metadata=DEVICE
    )
    with pytest.raises(grpc.RpcError) as tombstoned:
        activate(host, "act-1")
    assert tombstoned.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(tombstoned.value) == "SESSION_DELETED"
    assert "resume_session" not in sent_kinds(runtime)
    assert rows(sync_engine, HostOperation) == 0
    runtime.close()


@pytest.mark.spec("HOST-SES-9", "HOST-RT-5")
def test_a_rejected_resume_is_resume_rejected_and_records_no_activation(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    pending = pool.submit(activate, host, "act-1")
    command = runtime.next_command()
    runtime.ack(command.command_id, REJECTED)
    with pytest.raises(grpc.RpcError) as caught:
        pending.result(timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(caught.value) == "RESUME_REJECTED"
    assert rows(sync_engine, HostOperation) == 0
    assert rows(sync_engine, RuntimeCommandOutbox) == 0  # final: never re-sent
    assert no_command(runtime)

    # Nothing was recorded, so the same activation id tries again.
    retry = pool.submit(activate, host, "act-1")
    again = runtime.next_command()
    assert again.WhichOneof("command") == "resume_session"
    runtime.ack(again.command_id, ACCEPTED)
    assert not retry.result(timeout=10).replayed
    runtime.close()


@pytest.mark.spec("HOST-SES-9", "HOST-RT-5")
def test_an_unacknowledged_resume_is_withdrawn_and_the_call_is_retryable(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    host = start_host(live_server, migrated_db_url, runtime_command_timeout_seconds=0.5)
    runtime = host.runtime()
    pending = pool.submit(activate, host, "act-1")
    command = runtime.next_command()
    with pytest.raises(grpc.RpcError) as caught:
        pending.result(timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_reason(caught.value) == "RESUME_NOT_ACKNOWLEDGED"
    assert rows(sync_engine, RuntimeCommandOutbox) == 0  # withdrawn, never re-sent
    assert rows(sync_engine, HostOperation) == 0
    runtime.ack(command.command_id, ACCEPTED)  # a late ack changes nothing
    runtime.close()
    reconnected = host.runtime()
    assert no_command(reconnected)  # not among the unacknowledged commands of a reconnect
    reconnected.close()


@pytest.mark.spec("HOST-SES-9", "SEC-4")
@pytest.mark.parametrize(
    ("session_id", "activation_id", "field"),
    [
        ("", "act-1", "session_id"),
        ("s1", "", "activation_id"),
        ("s1", "has space", "activation_id"),
        ("s1", "x" * 129, "activation_id"),
    ],
)
def test_malformed_ids_are_invalid_and_send_nothing(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    session_id: str,
    activation_id: str,
    field: str,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    with pytest.raises(grpc.RpcError) as caught:
        activate(host, activation_id, session_id=session_id)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert no_command(runtime, wait=0.2)
    assert rows(sync_engine, RuntimeCommandOutbox) == 0
    runtime.close()


@pytest.mark.spec("HOST-SES-9", "HOST-LANE-1")
def test_activation_holds_the_sessions_mutation_lane_until_the_ack(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    pending = pool.submit(activate, host, "act-1")
    command = runtime.next_command()
    rename = pool.submit(
        host.stub.RenameSession,
        host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title="later"),
        metadata=DEVICE,
    )
    time.sleep(0.3)
    assert not rename.done()  # waits in the lane behind the activation
    runtime.ack(command.command_id, ACCEPTED)
    activated = pending.result(timeout=10)
    assert activated.detail.session.title == "title of s1"
    assert rename.result(timeout=10).session.title == "later"
    runtime.close()


@pytest.mark.spec("HOST-SES-9", "HOST-LANE-1", "HOST-RT-5")
def test_a_report_sent_before_the_ack_applies_and_the_activation_completes(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    # A runtime reports on the Session (say, its running Turn) before it acknowledges the
    # resume. Host applies a link's frames in order, so that report must apply while the
    # activation waits in the Session's lane; it used to wait for the lane, and the activation
    # for the ack behind it, until the timeout (UNAVAILABLE RESUME_NOT_ACKNOWLEDGED).
    host = start_host(live_server, migrated_db_url, runtime_command_timeout_seconds=5)
    runtime = host.runtime()
    pending = pool.submit(activate, host, "act-1")
    command = runtime.next_command()
    assert command.WhichOneof("command") == "resume_session"
    started = time.monotonic()
    runtime.send_report(
        WS,
        "s1",
        "resume-ref",
        runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(provider_session_ref="p-9")),
    )
    runtime.ack(command.command_id, ACCEPTED)
    activated = pending.result(timeout=10)
    assert time.monotonic() - started < 4  # not the timeout
    assert runtime.result("resume-ref").outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    assert not activated.replayed
    runtime.close()
