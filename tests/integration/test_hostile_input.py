"""Hostile input on every RPC of every service over real sockets (SEC-4, SEC-2).

A property-based suite: requests are generated from the message descriptors
(:mod:`tests.support.hostile_requests`), never written per RPC, and sent to all six real
servers (``live_server``) on SQLite and Postgres:

- valid-shaped requests with hostile values (odd Unicode, huge strings, integers at and
  past their bounds, unknown enum numbers, long repeated fields), workspaces of the caller
  so the call reaches its handler;
- undecodable bytes (invalid UTF-8, truncated varints, random bytes) as raw calls;
- recursive messages nested past our own limits and past protobuf's 100 levels;
- messages just above the server's receive limit and above documented bounds (1 MiB);
- out-of-order and hostile frames on ``RuntimeLink`` and ``DeviceLink``, and hostile
  ``WatchActivity`` requests;
- maintenance (with its Host on the same store): manual purges and status previews aimed
  next to the stored tombstone (unknown scopes, near-miss and wildcard ids, mistyped
  fields) and unknown retention periods, which must purge nothing and change nothing.

Every call must end within a short deadline with a status other than ``INTERNAL`` or
``UNKNOWN``; the server stays ``SERVING``; no ERROR line and no traceback is logged; and a
refused call (any status but OK; a stream refused before its first answer) changes
nothing: the row count of every store table and the whole activity event log read back the
same. Budgets come from the hypothesis profile (``TUTTI_HYPOTHESIS_PROFILE``, ``ci`` by
default, ``soak`` for long local runs); every RPC has its own fixed seed, so a CI run
sends the same requests every time. Each test prints how many requests it sent and
asserts a minimum.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message_factory import GetMessageClass
from hypothesis import given, seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from sqlalchemy import Engine, insert, literal_column, select, text

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2
from agentactivity.livestream.v1 import livestream_pb2
from agentactivity.maintenance.v1 import maintenance_pb2, maintenance_pb2_grpc
from services.host.app import RECEIVE_LIMIT_BYTES as HOST_RECEIVE_LIMIT
from services.host.runtime.registry import PROTOCOL_REVISION
from services.livestream.link import CURRENT_REVISION
from store.engine import create_sync_engine_for
from store.models import Base, Turn
from tests.support.host_sessions import demo_target
from tests.support.hostile_requests import (
    HOSTILE_STRINGS,
    field_bytes,
    hostile_message,
    mistyped_bytes,
    nested_bytes,
    oversize_bytes,
    recursion_paths,
    undecodable_bytes,
)
from tests.support.rpc_errors import error_details
from tests.support.server_health import assert_serving
from tests.support.servers import LiveServer, auth_metadata, token_for
from tests.support.session_trees import add_tree

DEADLINE = 5.0
"""Seconds any call may take; a client-side DEADLINE_EXCEEDED is a hang."""
WORKSPACES = ("ws-1",)
PRINCIPALS = ("admin", "ws1-admin", "ws1-service", "ws1-device", "")
"""Callers whose workspaces include ``ws-1`` (every role), so calls are admitted, and
``""``: no token at all (refused first, whatever the body)."""
DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
RUNTIME_LINK = "/agentactivity.host.v1.RuntimeLinkService/RuntimeLink"
DEVICE_LINK = "/agentactivity.livestream.v1.DeviceLinkService/DeviceLink"
FORBIDDEN = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


def _examples(divisor: int) -> int:
    """Examples per RPC: the loaded profile's budget over ``divisor`` (at least 3)."""
    return max(3, hypothesis_settings().max_examples // divisor)


# ------------------------------------------------------------------------- harness


def _counts_query() -> Any:
    tables = Base.metadata.sorted_tables
    return select(
        *(
            select(literal_column("count(*)"))
            .select_from(table)
            .scalar_subquery()
            .label(table.name)
            for table in tables
        )
    )


@dataclass
class Hostile:
    """All six servers on one store, and the checks every hostile call must pass."""

    servers: dict[str, LiveServer]
    engine: Engine
    caplog: pytest.LogCaptureFixture
    sent: int = 0
    refused: int = 0
    _checked_logs: int = 0
    _counts: Any = field(default_factory=_counts_query)

    def snapshot(self) -> tuple[Any, ...]:
        """Row count of every store table and the whole activity event log."""
        with self.engine.connect() as connection:
            counts = tuple(connection.execute(self._counts).one())
            events = connection.execute(
                text("SELECT id, workspace_id, payload FROM activity_events ORDER BY id")
            ).all()
        return counts, tuple(tuple(row) for row in events)

    def methods(self, shape: str) -> Iterator[tuple[LiveServer, MethodDescriptor]]:
        """Every served method of one shape: ``unary``, ``server_stream`` or ``bidi``."""
        pool = descriptor_pool.Default()
        for server in self.servers.values():
            for name in server.running.definition.service_names:
                for method in pool.FindServiceByName(name).methods:
                    kind = (
                        "bidi"
                        if method.client_streaming
                        else "server_stream"
                        if method.server_streaming
                        else "unary"
                    )
                    if kind == shape:
                        yield server, method

    def check_health_and_logs(self, server: LiveServer, what: object) -> None:
        """``server`` answers SERVING; no ERROR line or traceback was logged since last time."""
        assert_serving(server, what, DEADLINE)
        records = self.caplog.records[self._checked_logs :]
        self._checked_logs = len(self.caplog.records)
        loud = [
            f"{r.levelname} {r.name}: {r.getMessage()[:300]}"
            for r in records
            if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
        ]
        assert not loud, (what, loud)

    def outcome(self, code: grpc.StatusCode, details: str | None, what: object) -> None:
        """The status of a finished call is allowed."""
        assert code not in FORBIDDEN, (what, code, (details or "")[:500])
        # SEC-2: no stack trace crosses the wire.
        assert "Traceback" not in (details or ""), (what, code, details)
        assert code != grpc.StatusCode.DEADLINE_EXCEEDED, ("hang", what, (details or "")[:200])

    def unary(
        self, server: LiveServer, path: str, body: bytes, principal: str
    ) -> tuple[grpc.StatusCode, bytes | grpc.RpcError]:
        """Send raw ``body`` to a unary method and check the result.

        Returns:
            The status code and the response bytes (or the error of a refused call).
        """
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = server.channel.unary_unary(
            path, request_serializer=None, response_deserializer=None
        )
        what = (path, principal, body[:120], len(body))
        before = self.snapshot()
        self.sent += 1
        result: tuple[grpc.StatusCode, bytes | grpc.RpcError]
        try:
            result = (
                grpc.StatusCode.OK,
                call(body, metadata=_metadata(principal), timeout=DEADLINE),
            )
        except grpc.RpcError as error:
            self.outcome(error.code(), error.details(), what)
            self.refused += 1
            assert self.snapshot() == before, ("a refused call changed the store", what)
            result = (error.code(), error)
        self.check_health_and_logs(server, what)
        return result

    def server_stream(self, server: LiveServer, path: str, body: bytes, principal: str) -> None:
        """Open a server stream with ``body``: its first answer (or its end) must come fast."""
        call: grpc.UnaryStreamMultiCallable[bytes, bytes] = server.channel.unary_stream(
            path, request_serializer=None, response_deserializer=None
        )
        what = (path, principal, body[:120], len(body))
        before = self.snapshot()
        self.sent += 1
        responses = call(body, metadata=_metadata(principal), timeout=DEADLINE)
        try:
            next(responses)
        except StopIteration:
            pass
        except grpc.RpcError as error:
            self.outcome(error.code(), error.details(), what)
            self.refused += 1
            assert self.snapshot() == before, ("a refused stream changed the store", what)
        finally:
            responses.cancel()
        self.check_health_and_logs(server, what)

    def bidi(
        self, server: LiveServer, path: str, frames: Sequence[bytes], principal: str
    ) -> list[bytes]:
        """Send ``frames`` and half-close; the server must end the call within the deadline."""
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = server.channel.stream_stream(
            path, request_serializer=None, response_deserializer=None
        )
        what = (path, principal, [frame[:80] for frame in frames])
        before = self.snapshot()
        self.sent += 1
        answers: list[bytes] = []
        responses = call(iter(frames), metadata=_metadata(principal), timeout=DEADLINE)
        try:
            if path == DEVICE_LINK:
                # A device link outlives the half-close (only the device cancelling ends
                # it): alive once it answers, then cancelled; a refusal still ends it.
                answers.append(next(responses))
                responses.cancel()
            else:
                answers.extend(responses)
        except StopIteration:
            pass
        except grpc.RpcError as error:
            self.outcome(error.code(), error.details(), what)
            if not answers:
                self.refused += 1
                assert self.snapshot() == before, ("a refused stream changed the store", what)
        self.check_health_and_logs(server, what)
        return answers

    def report(self, test: str, minimum: int) -> None:
        """Print and check how many requests a test sent."""
        print(
            f"\n{test}: {self.sent} hostile requests sent, {self.refused} refused, "
            f"{self._checked_logs} WARNING lines logged (no ERROR, no traceback)"
        )
        assert self.sent >= minimum, (self.sent, minimum)


def _metadata(principal: str) -> tuple[tuple[str, str], ...]:
    return auth_metadata(principal) if principal else ()


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def _seed(path: str, salt: str) -> int:
    return zlib.crc32(f"{salt}:{path}".encode())


@pytest.fixture
def hostile(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    caplog: pytest.LogCaptureFixture,
) -> Iterator[Hostile]:
    """Every service on the test's store, seeded with a target and two Sessions in ws-1."""
    url = migrated_db_url
    engine = create_sync_engine_for(url)
    service = {"service_token": token_for("service")}
    apps = live_server("appcenter", database_url=url)
    issues = live_server("issuemanager", database_url=url)
    host = live_server("host", database_url=url)
    servers = {
        "appcenter": apps,
        "issuemanager": issues,
        "host": host,
        "maintenance": live_server(
            "maintenance", database_url=url, host_address=host.address, **service
        ),
        "livestream": live_server(
            "livestream", database_url=url, host_address=host.address, **service
        ),
        "refresolve": live_server(
            "refresolve",
            database_url=url,
            appcenter_address=apps.address,
            issuemanager_address=issues.address,
            **service,
        ),
    }
    stub = host_pb2_grpc.HostServiceStub(host.channel)
    stub.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(target=demo_target()),
        metadata=auth_metadata("admin"),
        timeout=15,
    )
    add_tree(engine, {"s-1": None, "s-del": None}, workspace_id="ws-1")
    with engine.begin() as connection:
        # A settled Turn with a file-change snapshot, so GetTurnResult and
        # SearchGeneratedFiles reach their reads (HOST-TURN-7, HOST-SES-8).
        connection.execute(
            insert(Turn).values(
                workspace_id="ws-1",
                session_id="s-1",
                turn_id="t-1",
                phase="settled",
                outcome="completed",
                origin="user",
                version=2,
                created_at_unix_ms=1,
                updated_at_unix_ms=2,
                settled_at_unix_ms=2,
                result_resolved_empty=True,
                file_changes_json='[{"path":"src/app.py","change":"created"}]',
            )
        )
    stub.DeleteSessions(
        host_pb2.DeleteSessionsRequest(workspace_id="ws-1", session_ids=["s-del"]),
        metadata=auth_metadata("admin"),
        timeout=15,
    )
    caplog.set_level(logging.WARNING)
    harness = Hostile(servers, engine, caplog)
    try:
        yield harness
        for server in servers.values():
            harness.check_health_and_logs(server, ("end", server.name))
    finally:
        engine.dispose()


# ------------------------------------------------------------------- unary RPCs


@pytest.mark.spec("SEC-4", "SEC-2")
def test_every_unary_rpc_survives_hostile_values_and_undecodable_bytes(
    hostile: Hostile,
) -> None:
    methods = list(hostile.methods("unary"))
    assert len(methods) > 40
    examples = _examples(6)
    for server, method in methods:
        path = _path(method)
        request = method.input_type

        @seed(_seed(path, "values"))
        @hypothesis_settings(max_examples=examples)
        @given(
            message=hostile_message(request, WORKSPACES),
            garbage=undecodable_bytes(request),
            principal=st.sampled_from(PRINCIPALS),
        )
        def run(message: Any, garbage: bytes, principal: str) -> None:
            hostile.unary(server, path, message.SerializeToString(), principal)  # noqa: B023
            hostile.unary(server, path, garbage, principal)  # noqa: B023

        run()
    hostile.report("unary", minimum=2 * 3 * len(methods))


@pytest.mark.spec("SEC-4", "SEC-2")
def test_every_rpc_refuses_messages_nested_past_the_limits(hostile: Hostile) -> None:
    levels = (8, 16, 17, 31, 32, 33, 64, 65, 99, 100, 101, 150, 1000)
    for shape in ("unary", "server_stream", "bidi"):
        for server, method in hostile.methods(shape):
            path = _path(method)
            request = method.input_type
            head_bytes = _own_workspace(GetMessageClass(request)()).SerializeToString()
            for prefix, cycle in recursion_paths(request):
                for level in levels:
                    count = max(1, level // len(cycle))
                    body = nested_bytes(prefix, cycle, count, head_bytes)
                    if shape == "unary":
                        hostile.unary(server, path, body, "admin")
                    elif shape == "server_stream":
                        hostile.server_stream(server, path, body, "admin")
                    else:
                        hostile.bidi(server, path, [*_hello_frames(path), body], "service")
    hostile.report("nesting", minimum=2 * len(levels))


@pytest.mark.spec("SEC-4", "SEC-2")
def test_every_unary_rpc_refuses_oversize_requests(hostile: Hostile) -> None:
    past_the_limit: set[str] = set()
    for server, method in hostile.methods("unary"):
        path = _path(method)
        head = _own_workspace(GetMessageClass(method.input_type)()).SerializeToString()
        # Past every documented free-text bound (1 MiB is the largest), within the limit.
        body = oversize_bytes(method.input_type, head, 1024 * 1024 + 1)
        if body is not None:
            hostile.unary(server, path, body, "admin")
        if server.name not in past_the_limit:
            # Just past the server's receive limit (once per server: the transport refuses
            # it before any handler, and sending megabytes per RPC would dominate the run).
            past_the_limit.add(server.name)
            limit = HOST_RECEIVE_LIMIT if server.name == "host" else DEFAULT_RECEIVE_LIMIT
            for size in (limit - 64, limit + 1):
                hostile.unary(server, path, head + field_bytes(15_999, b"a" * size), "admin")
    hostile.report("oversize", minimum=50)


@pytest.mark.spec("SEC-4", "SEC-2")
def test_runtime_reports_past_the_advertised_size_are_refused_on_a_live_link(
    hostile: Hostile,
) -> None:
    host = hostile.servers["host"]
    hello = _runtime_hello("rt-oversize")
    welcome = runtime_pb2.RuntimeLinkResponse.FromString(
        hostile.bidi(host, RUNTIME_LINK, [hello], "service")[0]
    )
    advertised = welcome.welcome.max_report_bytes
    assert advertised > 0
    for size in (advertised - 1024, advertised + 1, HOST_RECEIVE_LIMIT - 1024):
        report = runtime_pb2.RuntimeReport(
            report_id=f"big-{size}", workspace_id="ws-1", session_id="s-1"
        ).SerializeToString() + field_bytes(15_999, b"a" * size)
        frame = field_bytes(2, report)
        answers = hostile.bidi(host, RUNTIME_LINK, [hello, frame], "service")
        results = [
            runtime_pb2.RuntimeLinkResponse.FromString(answer).report_result
            for answer in answers
            if runtime_pb2.RuntimeLinkResponse.FromString(answer).HasField("report_result")
        ]
        # The link stays up and answers the report with a verdict.
        assert [result.report_id for result in results] == [f"big-{size}"], size
        if size > advertised:
            assert results[0].outcome == runtime_pb2.REPORT_OUTCOME_REJECTED, (size, results)
    hostile.report("oversize reports", minimum=4)


def _own_workspace(message: Any) -> Any:
    """``message`` with every top-level workspace field naming ws-1."""
    for descriptor in message.DESCRIPTOR.fields:
        if descriptor.name == "workspace_id":
            setattr(message, descriptor.name, "ws-1")
        elif descriptor.name == "workspace_ids":
            del getattr(message, descriptor.name)[:]
            getattr(message, descriptor.name).append("ws-1")
    return message


# ---------------------------------------------------------------------- streams


def _runtime_hello(runtime_id: str = "rt-hostile") -> bytes:
    return runtime_pb2.RuntimeLinkRequest(
        hello=runtime_pb2.RuntimeHello(
            runtime_id=runtime_id,
            runtime_instance_id="instance-1",
            protocol_revision=PROTOCOL_REVISION,
            providers=["demo"],
            capabilities=canonical_pb2.RuntimeCapabilities(
                guidance=True, interrupt=True, live_settings=True
            ),
        )
    ).SerializeToString()


def _device_hello() -> bytes:
    return livestream_pb2.DeviceLinkRequest(
        hello=livestream_pb2.ClientHello(
            protocol_revision=CURRENT_REVISION,
            device_id="device-hostile",
            workspace_ids=["ws-1"],
        )
    ).SerializeToString()


def _hello_frames(path: str) -> list[bytes]:
    if path == RUNTIME_LINK:
        return [_runtime_hello()]
    if path == DEVICE_LINK:
        return [_device_hello()]
    return []


@pytest.mark.spec("SEC-4", "SEC-2")
def test_watch_activity_survives_hostile_requests(hostile: Hostile) -> None:
    streams = list(hostile.methods("server_stream"))
    assert streams
    for server, method in streams:
        path = _path(method)

        @seed(_seed(path, "watch"))
        @hypothesis_settings(max_examples=_examples(2))
        @given(
            message=hostile_message(method.input_type, WORKSPACES),
            garbage=undecodable_bytes(method.input_type),
            principal=st.sampled_from(PRINCIPALS),
        )
        def run(message: Any, garbage: bytes, principal: str) -> None:
            hostile.server_stream(server, path, message.SerializeToString(), principal)  # noqa: B023
            hostile.server_stream(server, path, garbage, principal)  # noqa: B023

        run()
    hostile.report("watch", minimum=2 * 3 * len(streams))


def _frame(method: MethodDescriptor) -> st.SearchStrategy[bytes]:
    """One client frame: a hostile-valued message, a valid hello, or undecodable bytes."""
    path = _path(method)
    return st.one_of(
        hostile_message(method.input_type, WORKSPACES).map(lambda m: m.SerializeToString()),
        st.sampled_from(_hello_frames(path) or [b""]),
        undecodable_bytes(method.input_type),
    )


@pytest.mark.spec("SEC-4", "SEC-2")
def test_link_streams_survive_hostile_frame_sequences(hostile: Hostile) -> None:
    links = list(hostile.methods("bidi"))
    assert sorted(_path(method) for _, method in links) == sorted([DEVICE_LINK, RUNTIME_LINK])
    for server, method in links:
        path = _path(method)

        @seed(_seed(path, "frames"))
        @hypothesis_settings(max_examples=_examples(2))
        @given(
            frames=st.lists(_frame(method), min_size=1, max_size=6),
            hello_first=st.booleans(),
            principal=st.sampled_from(("service", "ws1-service", "ws1-device", "admin", "")),
        )
        def run(frames: list[bytes], hello_first: bool, principal: str) -> None:
            opening = _hello_frames(path) if hello_first else []  # noqa: B023
            hostile.bidi(server, path, [*opening, *frames], principal)  # noqa: B023

        run()
    hostile.report("links", minimum=2 * 3)


def _runtime(**frame: Any) -> bytes:
    return runtime_pb2.RuntimeLinkRequest(**frame).SerializeToString()


def _device(**frame: Any) -> bytes:
    return livestream_pb2.DeviceLinkRequest(**frame).SerializeToString()


@pytest.mark.spec("SEC-4", "SEC-2")
def test_link_streams_survive_out_of_order_frames(hostile: Hostile) -> None:
    report = _runtime(
        report=runtime_pb2.RuntimeReport(report_id="r-1", workspace_id="ws-1", session_id="s-1")
    )
    tombstone_report = _runtime(
        report=runtime_pb2.RuntimeReport(report_id="r-2", workspace_id="ws-1", session_id="s-del")
    )
    ack = _runtime(
        command_ack=runtime_pb2.CommandAck(
            command_id="no-such-command", status=runtime_pb2.COMMAND_ACK_STATUS_ACCEPTED
        )
    )
    deltas = _runtime(deltas=runtime_pb2.MessageDeltaBatch())
    hello = _runtime_hello()
    runtime_cases = [
        [report],
        [ack],
        [deltas],
        [b""],
        [hello, hello],
        [hello, _runtime_hello("rt-other")],
        [hello, ack, ack],
        [hello, report, report],
        [hello, tombstone_report],
        [hello, deltas, ack, hello],
        [hello, b"\x0a\x02\xff\xfe"],
        [hello, bytes.fromhex("0880")],
    ]
    host = hostile.servers["host"]
    for frames in runtime_cases:
        for principal in ("service", "ws1-service", "ws1-device"):
            hostile.bidi(host, RUNTIME_LINK, frames, principal)

    device_hello = _device_hello()
    attach = _device(
        attach=livestream_pb2.ClientAttach(
            binding_id="b-1", revision=1, workspace_id="ws-1", session_id="s-1"
        )
    )
    foreign_attach = _device(
        attach=livestream_pb2.ClientAttach(
            binding_id="b-2", revision=1, workspace_id="ws-2", session_id="s-1"
        )
    )
    detach = _device(detach=livestream_pb2.ClientDetach(binding_id="unknown", revision=7))
    heartbeat = _device(
        heartbeat=livestream_pb2.ClientHeartbeat(epoch="no-epoch", last_sequence=2**62)
    )
    device_cases = [
        [attach],
        [detach],
        [heartbeat],
        [b""],
        [device_hello, device_hello],
        [device_hello, detach],
        [device_hello, heartbeat, heartbeat],
        [device_hello, attach, attach, detach, detach],
        [device_hello, foreign_attach],
        [device_hello, b"\x0a\x02\xff\xfe"],
        [device_hello, bytes.fromhex("0880")],
    ]
    live = hostile.servers["livestream"]
    for frames in device_cases:
        for principal in ("ws1-device", "ws1-service", "admin"):
            hostile.bidi(live, DEVICE_LINK, frames, principal)
    hostile.report("out of order", minimum=3 * (len(runtime_cases) + len(device_cases)))


# ------------------------------------------------------------------ maintenance

MAINTENANCE = "/agentactivity.maintenance.v1.MaintenanceService/"
COMPONENT = maintenance_pb2.PURGE_SCOPE_COMPONENT
WORKSPACE = maintenance_pb2.PURGE_SCOPE_WORKSPACE
UNKNOWN_ENUMS = (3, 4, 999, -1, 2**31 - 1, -(2**31))
HOSTILE_IDS = (
    *HOSTILE_STRINGS,
    "s-del\x00",
    "S-DEL",
    " s-del",
    "s-del ",
    "s-%",
    "s-_el",
    "a" * 300_001,
    "\x00" * 65_537,
    "\U0001f600" * 65_537,
)
"""Session ids next to the stored tombstone ``s-del``: none of them may purge it."""
HOSTILE_WORKSPACES = (
    *HOSTILE_STRINGS,
    "WS-1",
    " ws-1",
    "ws-1 ",
    "ws-%",
    "ws-_",
    "ws-1\x00",
    "a" * 300_001,
)
"""Workspace ids next to ``ws-1``: a wildcard or a near miss must never purge ws-1."""


def _purge(**fields: Any) -> bytes:
    return maintenance_pb2.RunManualPurgeRequest(**fields).SerializeToString()


def _maintenance_state(hostile: Hostile) -> tuple[list[str], Any, Any]:
    """ws-1's topmost tombstones (Host), the retention preference and the store snapshot."""
    host = host_pb2_grpc.HostServiceStub(hostile.servers["host"].channel)
    deleted = host.ListDeletedSessions(
        host_pb2.ListDeletedSessionsRequest(workspace_id="ws-1"),
        metadata=auth_metadata("admin"),
        timeout=DEADLINE,
    )
    maintenance = maintenance_pb2_grpc.MaintenanceServiceStub(
        hostile.servers["maintenance"].channel
    )
    retention = maintenance.GetRetentionPreference(
        maintenance_pb2.GetRetentionPreferenceRequest(),
        metadata=auth_metadata("admin"),
        timeout=DEADLINE,
    ).preference
    return [item.session.session_id for item in deleted.items], retention, hostile.snapshot()


def _refused_with(result: tuple[grpc.StatusCode, Any], code: grpc.StatusCode, field: str) -> None:
    status, error = result
    assert status == code, (status, code, field)
    assert isinstance(error, grpc.RpcError)
    _, _, fields = error_details(error)
    assert field in fields, (field, fields)


@pytest.mark.spec("SEC-4", "SEC-2", "MAINT-MAN-1", "MAINT-PREF-1", "MAINT-STAT-1")
def test_maintenance_refuses_hostile_targets_and_purges_nothing(hostile: Hostile) -> None:
    """Manual purges with unknown scopes, hostile or near-miss Session and workspace ids,
    mistyped fields; retention with unknown periods; status previews of hostile
    workspaces. Each gets a typed answer, and the tombstone ``s-del``, the retention
    preference and every table stay as they were."""
    maintenance = hostile.servers["maintenance"]
    purge, retention, status = (
        MAINTENANCE + name
        for name in ("RunManualPurge", "SetRetentionPreference", "GetMaintenanceStatus")
    )
    before = _maintenance_state(hostile)
    assert before[0] == ["s-del"]
    assert before[1].is_default
    invalid = grpc.StatusCode.INVALID_ARGUMENT

    for principal in ("admin", "ws1-service"):
        for scope in UNKNOWN_ENUMS:
            for extra in ({}, {"session_id": "s-del"}):
                body = _purge(workspace_id="ws-1", scope=scope, **extra)
                _refused_with(hostile.unary(maintenance, purge, body, principal), invalid, "scope")
        for session_id in HOSTILE_IDS:
            body = _purge(workspace_id="ws-1", scope=COMPONENT, session_id=session_id)
            code, _ = hostile.unary(maintenance, purge, body, principal)
            # A near miss is not found or an invalid id; it never reaches s-del.
            assert code in (invalid, grpc.StatusCode.NOT_FOUND), (session_id[:40], code)
        for wrong in mistyped_bytes(maintenance_pb2.RunManualPurgeRequest.DESCRIPTOR):
            # A mistyped field is unset: no workspace, or a component without its id.
            for head in (b"", _purge(workspace_id="ws-1", scope=COMPONENT)):
                code, _ = hostile.unary(maintenance, purge, head + wrong, principal)
                assert code == invalid, (head, wrong, code)

    for workspace_id in HOSTILE_WORKSPACES:
        for scope, extra in ((WORKSPACE, {}), (COMPONENT, {"session_id": "s-del"})):
            body = _purge(workspace_id=workspace_id, scope=scope, **extra)
            code, answer = hostile.unary(maintenance, purge, body, "admin")
            if code == grpc.StatusCode.OK:
                assert isinstance(answer, bytes)
                response = maintenance_pb2.RunManualPurgeResponse.FromString(answer)
                assert not response.purged_session_ids, (workspace_id[:40], response)
            else:
                assert code in (invalid, grpc.StatusCode.NOT_FOUND), (workspace_id[:40], code)
            # A workspace-scoped operator is refused anything but its own workspace.
            code, _ = hostile.unary(maintenance, purge, body, "ws1-service")
            expected = invalid if workspace_id == "" else grpc.StatusCode.PERMISSION_DENIED
            assert code == expected, (workspace_id[:40], code)

    for period in UNKNOWN_ENUMS:
        body = maintenance_pb2.SetRetentionPreferenceRequest(
            retention=maintenance_pb2.RetentionPeriod.ValueType(period)
        ).SerializeToString()
        _refused_with(hostile.unary(maintenance, retention, body, "admin"), invalid, "retention")
    for wrong in mistyped_bytes(maintenance_pb2.SetRetentionPreferenceRequest.DESCRIPTOR):
        _refused_with(hostile.unary(maintenance, retention, wrong, "admin"), invalid, "retention")

    for workspace_id in HOSTILE_WORKSPACES:
        body = maintenance_pb2.GetMaintenanceStatusRequest(
            preview_workspace_id=workspace_id
        ).SerializeToString()
        code, answer = hostile.unary(maintenance, status, body, "admin")
        if code == grpc.StatusCode.OK:
            assert isinstance(answer, bytes)
            preview = maintenance_pb2.GetMaintenanceStatusResponse.FromString(
                answer
            ).manual_purge_preview
            # Only ws-1 holds a tombstone; no wildcard previews it.
            assert preview.topmost_components == 0, (workspace_id[:40], preview)
        else:
            assert code == invalid, (workspace_id[:40], code)
        code, _ = hostile.unary(maintenance, status, body, "ws1-device")
        expected = invalid if workspace_id == "" else grpc.StatusCode.PERMISSION_DENIED
        assert code == expected, (workspace_id[:40], code)
    for wrong in mistyped_bytes(maintenance_pb2.GetMaintenanceStatusRequest.DESCRIPTOR):
        # A mistyped preview field is unset: the status without a preview.
        code, _ = hostile.unary(maintenance, status, wrong, "ws1-device")
        assert code == grpc.StatusCode.OK, (wrong, code)

    assert _maintenance_state(hostile) == before
    hostile.report("maintenance", minimum=300)
