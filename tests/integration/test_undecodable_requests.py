"""Undecodable and over-deep requests are typed refusals after authentication (SEC-4).

Raw bytes go over real sockets to every method of all six services: invalid UTF-8 in a
string field and a truncated varint answer ``INVALID_ARGUMENT`` ``UNDECODABLE_REQUEST``
(never gRPC's ``UNKNOWN``) with one WARNING log line and no traceback, and without a token
the same bytes are ``UNAUTHENTICATED``. Over-deep messages: ``LoadApps`` groups and
``RuntimeLink`` tool-call steps, past the decoder's limit and past our own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from grpc_health.v1 import health_pb2

from agentactivity.appcenter.v1 import appcenter_pb2
from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from services.host.runtime.registry import PROTOCOL_REVISION
from tests.integration.host_activity import WS, start_host
from tests.support.hostile_requests import field_bytes
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import turn_patch
from tests.support.servers import LiveServer, auth_metadata

SERVICES = ("host", "refresolve", "livestream", "maintenance", "appcenter", "issuemanager")
ADMIN = auth_metadata("admin")
BAD_UTF8 = bytes.fromhex("0a02fffe")
"""Field 1, length 2, bytes ``ff fe``: invalid UTF-8 when field 1 is a string."""
TRUNCATED_VARINT = bytes.fromhex("0880")
"""Field 1 as a varint whose continuation bit promises a byte that never comes."""
RUNTIME_LINK = "/agentactivity.host.v1.RuntimeLinkService/RuntimeLink"


def _raw_unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def _status(error: grpc.RpcError) -> tuple[grpc.StatusCode, str, set[str]]:
    """Code, ErrorInfo reason and BadRequest fields of a failed call."""
    return error_details(error)


def _refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, set[str]]:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    return _status(failure.value)


def _methods(server: LiveServer) -> Iterator[MethodDescriptor]:
    pool = descriptor_pool.Default()
    for name in server.running.definition.service_names:
        yield from pool.FindServiceByName(name).methods


def _string_field_1(message: Descriptor) -> bool:
    field = message.fields_by_number.get(1)
    return field is not None and field.type == FieldDescriptor.TYPE_STRING


def _start_all(live_server: Callable[..., LiveServer], url: str) -> dict[str, LiveServer]:
    servers = {}
    for name in SERVICES:
        overrides = {} if name in ("refresolve", "livestream") else {"database_url": url}
        servers[name] = live_server(name, **overrides)
    return servers


def _undecodable_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("undecodable request")]


def _assert_no_errors_or_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]


@pytest.mark.spec("SEC-4", "SEC-1", "SEC-2")
def test_undecodable_bytes_are_invalid_argument_on_every_unary_method_of_every_service(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    servers = _start_all(live_server, migrated_db_url)
    caplog.set_level(logging.WARNING)
    refused = 0
    for name, server in servers.items():
        unary = [m for m in _methods(server) if not m.client_streaming and not m.server_streaming]
        assert unary or name == "livestream", name
        for method in unary:
            path = f"/{method.containing_service.full_name}/{method.name}"
            call = _raw_unary(server.channel, path)
            cases = [TRUNCATED_VARINT]
            if _string_field_1(method.input_type):
                cases.append(BAD_UTF8)
            for body in cases:
                # Authentication first: without a token the body is never looked at.
                code, reason, _ = _refusal(lambda: call(body, timeout=10))  # noqa: B023
                assert code == grpc.StatusCode.UNAUTHENTICATED, (path, body)
                code, reason, fields = _refusal(
                    lambda: call(body, metadata=ADMIN, timeout=10)  # noqa: B023
                )
                assert (code, reason) == (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "UNDECODABLE_REQUEST",
                ), (path, body)
                if body == BAD_UTF8:
                    assert fields == {method.input_type.fields_by_number[1].name}, path
                refused += 1
    assert refused > 50
    # One WARNING per refused call, none for the unauthenticated ones, no traceback.
    assert len(_undecodable_warnings(caplog)) == refused
    _assert_no_errors_or_tracebacks(caplog)


@pytest.mark.spec("SEC-4", "SEC-3")
def test_a_caller_the_table_refuses_hears_permission_denied_whatever_its_bytes(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    """Authorization needs no body: a device calling a purge with garbage is not told
    INVALID_ARGUMENT (which would say the method is open to it)."""
    host = live_server("host", database_url=migrated_db_url)
    purge = _raw_unary(host.channel, "/agentactivity.host.v1.HostService/PurgeDeletedSessions")
    code, reason, _ = _refusal(
        lambda: purge(BAD_UTF8, metadata=auth_metadata("ws1-device"), timeout=10)
    )
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    code, reason, _ = _refusal(lambda: purge(BAD_UTF8, metadata=ADMIN, timeout=10))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST")


@pytest.mark.spec("SEC-4")
def test_health_refuses_undecodable_bytes_without_a_token(
    live_server: Callable[..., LiveServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = live_server("livestream")
    caplog.set_level(logging.WARNING)
    call = _raw_unary(server.channel, "/grpc.health.v1.Health/Check")
    code, reason, fields = _refusal(lambda: call(BAD_UTF8, timeout=10))
    assert (code, reason, fields) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "UNDECODABLE_REQUEST",
        {"service"},
    )
    # A decodable check still answers.
    answer = health_pb2.HealthCheckResponse.FromString(
        call(health_pb2.HealthCheckRequest().SerializeToString(), timeout=10)
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert len(_undecodable_warnings(caplog)) == 1
    _assert_no_errors_or_tracebacks(caplog)


_field = field_bytes


def _number(message: Descriptor, name: str) -> int:
    return int(message.fields_by_name[name].number)


def _nested_groups(levels: int) -> bytes:
    """A ``LoadAppsRequest`` whose one app holds a chain of ``levels`` groups."""
    group = appcenter_pb2.ArtifactGroupTree
    groups = _number(group.DESCRIPTOR, "groups")
    inner = group(group_id="g0").SerializeToString()
    for level in range(1, levels):
        inner = group(group_id=f"g{level}").SerializeToString() + _field(groups, inner)
    app = appcenter_pb2.AppTree(app_id="deep").SerializeToString()
    app += _field(_number(appcenter_pb2.AppTree.DESCRIPTOR, "groups"), inner)
    request = appcenter_pb2.LoadAppsRequest(workspace_id="ws-1").SerializeToString()
    return request + _field(_number(appcenter_pb2.LoadAppsRequest.DESCRIPTOR, "apps"), app)


@pytest.mark.spec("SEC-4", "SEC-2")
def test_load_apps_nested_past_the_decoder_and_past_the_bound_is_invalid_argument(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = live_server("appcenter", database_url=migrated_db_url)
    caplog.set_level(logging.WARNING)
    load = _raw_unary(server.channel, "/agentactivity.appcenter.v1.AppCenterService/LoadApps")
    # 120 groups deep: more than the 100 message levels the runtime decodes.
    code, reason, fields = _refusal(lambda: load(_nested_groups(120), metadata=ADMIN, timeout=10))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST")
    assert fields
    assert [f for f in fields if f.startswith("apps[0].groups[0].groups[0]")], fields
    # 40 deep decodes but exceeds TUTTI_APPCENTER_LOAD_MAX_DEPTH (32): refused at level 33,
    # before the tree is converted or validated any deeper.
    code, reason, fields = _refusal(lambda: load(_nested_groups(40), metadata=ADMIN, timeout=10))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert fields == {"apps"}
    # A tree at the bound loads.
    response = appcenter_pb2.LoadAppsResponse.FromString(
        load(_nested_groups(32), metadata=ADMIN, timeout=10)
    )
    assert (response.apps_loaded, response.groups_loaded) == (1, 32)
    _assert_no_errors_or_tracebacks(caplog)


def _deep_tool_call_item(levels: int, message_id: str, turn_id: str = "t-deep") -> bytes:
    """A report item: one tool-call message of ``turn_id`` whose steps nest ``levels`` deep."""
    snapshot = runtime_pb2.ToolCallSnapshot
    steps = _number(snapshot.DESCRIPTOR, "steps")
    call = snapshot(call_id="c0", tool_name="Bash").SerializeToString()
    for level in range(1, levels):
        call = snapshot(call_id=f"c{level}", tool_name="Bash").SerializeToString() + _field(
            steps, call
        )
    message = runtime_pb2.MessageSnapshot(
        message_id=message_id,
        turn_id=turn_id,
        role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
        kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
        user_visible_assistant_response=False,
    ).SerializeToString()
    message += _field(_number(runtime_pb2.MessageSnapshot.DESCRIPTOR, "tool_call"), call)
    return _field(_number(runtime_pb2.ReportItem.DESCRIPTOR, "message_snapshot"), message)


def _deep_tool_call_frame(levels: int, report_id: str) -> bytes:
    """A RuntimeLink report frame holding :func:`_deep_tool_call_item`."""
    item = _deep_tool_call_item(levels, f"m-{report_id}")
    report = runtime_pb2.RuntimeReport(
        report_id=report_id, workspace_id=WS, session_id="s1"
    ).SerializeToString()
    report += _field(_number(runtime_pb2.RuntimeReport.DESCRIPTOR, "items"), item)
    return _field(_number(runtime_pb2.RuntimeLinkRequest.DESCRIPTOR, "report"), report)


@pytest.mark.spec("SEC-4", "HOST-RT-1")
def test_runtime_link_tool_call_steps_too_deep(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = start_host(live_server, migrated_db_url)
    caplog.set_level(logging.WARNING)
    runtime = host.runtime()
    turn = host.send("hello", "c1").turn
    runtime.ack(runtime.next_command().command_id)
    # 40 levels decode but exceed MAX_STEP_DEPTH (32): that report is rejected, the link stays.
    deep = runtime_pb2.ReportItem.FromString(_deep_tool_call_item(40, "m1", turn.turn_id))
    verdict = runtime.report(WS, "s1", "r1", deep)
    assert (verdict.outcome, verdict.reason) == (
        runtime_pb2.REPORT_OUTCOME_REJECTED,
        "INVALID_TOOL_CALL",
    )
    alive = runtime.report(
        WS, "s1", "r2", turn_patch(turn.turn_id, canonical_pb2.TURN_PHASE_RUNNING)
    )
    assert alive.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    runtime.close()
    assert runtime.error is None
    # 200 levels cannot be decoded: the frame ends the link with INVALID_ARGUMENT, not INTERNAL.
    hello = runtime_pb2.RuntimeLinkRequest(
        hello=runtime_pb2.RuntimeHello(
            runtime_id="rt-deep",
            runtime_instance_id="i",
            protocol_revision=PROTOCOL_REVISION,
            providers=["demo"],
        )
    ).SerializeToString()
    link: grpc.StreamStreamMultiCallable[bytes, runtime_pb2.RuntimeLinkResponse]
    link = host.server.channel.stream_stream(
        RUNTIME_LINK,
        request_serializer=None,
        response_deserializer=runtime_pb2.RuntimeLinkResponse.FromString,
    )
    frames = link(
        iter([hello, _deep_tool_call_frame(200, "r3")]), metadata=auth_metadata("service")
    )
    kinds: list[str | None] = []
    with pytest.raises(grpc.RpcError) as failure:
        kinds.extend(frame.WhichOneof("frame") for frame in frames)
    assert kinds == ["welcome"]
    code, reason, fields = _status(failure.value)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST")
    assert fields
    assert [
        f for f in fields if f.startswith("report.items[0].message_snapshot.tool_call.steps[0]")
    ], fields
    assert len(_undecodable_warnings(caplog)) == 1
    _assert_no_errors_or_tracebacks(caplog)


@pytest.mark.spec("SEC-4", "SEC-1")
def test_runtime_link_undecodable_frames(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    link: grpc.StreamStreamMultiCallable[bytes, runtime_pb2.RuntimeLinkResponse]
    link = host.server.channel.stream_stream(
        RUNTIME_LINK,
        request_serializer=None,
        response_deserializer=runtime_pb2.RuntimeLinkResponse.FromString,
    )
    # No token: UNAUTHENTICATED before anything is read.
    code, _, _ = _refusal(lambda: list(link(iter([BAD_UTF8]), timeout=10)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # An undecodable first frame (where the hello should be).
    service = auth_metadata("service")
    code, reason, _ = _refusal(lambda: list(link(iter([TRUNCATED_VARINT]), metadata=service)))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNDECODABLE_REQUEST")
