"""Edge validation of Host requests and runtime reports, on SQLite and Postgres (SEC-2).

* An enum number the contract does not define is ``INVALID_ARGUMENT`` with a field
  violation naming its path, on every unary RPC (the interceptor's generic descriptor
  check, :mod:`grpcserver.request_checks`) and inside runtime reports (``REJECTED``
  ``INVALID_FIELD_VALUE``); it is never read as a default (an unknown composer mode used
  to become AGENT). A NUL character, which Postgres ``text`` cannot hold, is refused the
  same way on both backends.
* Free-text filters are bounded (``ListDeletedSessions.title_filter`` by the bound
  ``SearchSessions`` uses).
* ``WatchActivity`` never emits a ``latest_message_version`` above 2^53-1 (CON-4).
* A report never clears a Session's agent target and names only a registered target of the
  Session's provider (HOST-SES-1).

Every refused call is checked to have changed nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, delete, func, insert, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import activity_pb2, host_pb2, runtime_pb2
from services.host.runtime import link
from services.host.sessions.listing import MAX_SEARCH_LENGTH
from store.engine import create_sync_engine_for
from store.models import ActivityEvent, WorkspaceEventHead
from tests.integration.host_activity import DEVICE, PROVIDER, TARGET_ID, WS, start_host
from tests.support.activity_watch import Watcher
from tests.support.host_sessions import error_of
from tests.support.runtime_client import turn_patch
from tests.support.servers import LiveServer, auth_metadata
from tests.support.store_snapshot import session_ids, snapshot

ADMIN = auth_metadata("admin")
APPLIED = runtime_pb2.REPORT_OUTCOME_APPLIED
REJECTED = runtime_pb2.REPORT_OUTCOME_REJECTED
UNKNOWN = 99
"""An enum number no contract enum defines."""


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    engine = create_sync_engine_for(migrated_db_url)
    yield engine
    engine.dispose()


def _refused(call: Callable[[], Any]) -> set[str]:
    """The violated fields of a call that must be INVALID_ARGUMENT."""
    code, reason, fields, _ = error_of(call)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    return fields


@pytest.mark.spec("SEC-2", "HOST-MENT-1", "HOST-TURN-1", "CON-5")
def test_an_unknown_composer_mode_is_refused_never_read_as_agent(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()  # a runtime is linked: only the mode can refuse the input
    before = snapshot(engine, WS, ["s1"])
    send = host_pb2.SendInputRequest(
        workspace_id=WS,
        session_id="s1",
        client_submit_id="c1",
        delivery=canonical_pb2.DELIVERY_MODE_NEW_TURN,
        content="hello",
    )
    send.mode = UNKNOWN  # type: ignore[assignment]
    assert _refused(lambda: host.stub.SendInput(send, metadata=DEVICE)) == {"mode"}
    create = host_pb2.CreateSessionRequest(
        workspace_id=WS,
        agent_target_id=TARGET_ID,
        session_id="s2",
        cwd="/w",
        initial_input=host_pb2.InitialInput(client_submit_id="c2", content="hi"),
    )
    create.initial_input.mode = UNKNOWN  # type: ignore[assignment]
    fields = _refused(lambda: host.stub.CreateSession(create, metadata=DEVICE))
    assert fields == {"initial_input.mode"}
    assert snapshot(engine, WS, ["s1"]) == before
    assert session_ids(engine, WS) == {"s1"}
    assert runtime.commands.empty()  # no Turn was started
    runtime.close()


@pytest.mark.spec("SEC-2", "CON-5")
def test_unknown_enum_values_are_refused_on_every_unary_rpc_with_their_path(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    before = snapshot(engine, WS, ["s1"])
    messages = host_pb2.ListSessionMessagesRequest(workspace_id=WS, session_id="s1")
    messages.order = UNKNOWN  # type: ignore[assignment]
    catalog = host_pb2.GetMentionCatalogRequest(workspace_id=WS, session_id="s1")
    catalog.mode = 7  # type: ignore[assignment]
    send = host_pb2.SendInputRequest(
        workspace_id=WS, session_id="s1", client_submit_id="c1", content="hi"
    )
    send.delivery = UNKNOWN  # type: ignore[assignment]
    send.mode = -3  # type: ignore[assignment]
    cases: list[tuple[str, Any, set[str]]] = [
        ("ListSessionMessages", messages, {"order"}),
        ("GetMentionCatalog", catalog, {"mode"}),
        ("SendInput", send, {"delivery", "mode"}),
    ]
    for method, request, expected in cases:
        fields = _refused(functools.partial(getattr(host.stub, method), request, metadata=DEVICE))
        assert fields == expected, method
    assert snapshot(engine, WS, ["s1"]) == before


@pytest.mark.spec("SEC-2", "SEC-4", "STORE-1")
def test_a_nul_character_is_refused_the_same_on_both_backends(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    before = snapshot(engine, WS, ["s1"])
    create = host_pb2.CreateSessionRequest(
        workspace_id=WS, agent_target_id=TARGET_ID, session_id="s2", title="a\x00b", cwd="/w"
    )
    assert _refused(lambda: host.stub.CreateSession(create, metadata=DEVICE)) == {"title"}
    rename = host_pb2.RenameSessionRequest(workspace_id=WS, session_id="s1", title="\x00")
    assert _refused(lambda: host.stub.RenameSession(rename, metadata=DEVICE)) == {"title"}
    assert snapshot(engine, WS, ["s1"]) == before
    assert session_ids(engine, WS) == {"s1"}


@pytest.mark.spec("SEC-2", "HOST-DEL-7", "HOST-SES-4")
def test_free_text_filters_are_bounded_like_search(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    host = start_host(live_server, migrated_db_url)
    huge = "x" * (3 * 1024 * 1024)
    deleted = host_pb2.ListDeletedSessionsRequest(workspace_id=WS, title_filter=huge)
    fields = _refused(lambda: host.stub.ListDeletedSessions(deleted, metadata=DEVICE))
    assert fields == {"title_filter"}
    bound = "x" * MAX_SEARCH_LENGTH
    at_bound = host_pb2.ListDeletedSessionsRequest(workspace_id=WS, title_filter=bound)
    assert list(host.stub.ListDeletedSessions(at_bound, metadata=DEVICE).items) == []
    just_over = host_pb2.ListDeletedSessionsRequest(workspace_id=WS, title_filter=bound + "x")
    fields = _refused(lambda: host.stub.ListDeletedSessions(just_over, metadata=DEVICE))
    assert fields == {"title_filter"}
    search = host_pb2.SearchSessionsRequest(workspace_id=WS, search_query=bound + "x")
    assert _refused(lambda: host.stub.SearchSessions(search, metadata=DEVICE)) == {"search_query"}
    overridden = host_pb2.SearchSessionsRequest(
        workspace_id=WS,
        search_query="title",
        filter=host_pb2.SessionListFilter(search_query=huge),
    )
    assert _refused(lambda: host.stub.SearchSessions(overridden, metadata=DEVICE)) == {
        "filter.search_query"
    }


@pytest.mark.spec("CON-4", "HOST-OBS-2")
def test_watch_activity_fails_rather_than_emit_a_version_above_2_53(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    event = activity_pb2.ActivityEvent(
        workspace_id=WS,
        message_update=activity_pb2.MessageUpdateEvent(
            session_id="s1", latest_message_version=2**53
        ),
    )
    with engine.begin() as connection:  # a row stored before encode checked the bound
        # Numbered as an append numbers it: the workspace's next sequence, its head moved.
        seq = (
            1
            + connection.execute(
                select(func.coalesce(func.max(WorkspaceEventHead.last_seq), 0)).where(
                    WorkspaceEventHead.workspace_id == WS
                )
            ).scalar_one()
        )
        connection.execute(delete(WorkspaceEventHead).where(WorkspaceEventHead.workspace_id == WS))
        connection.execute(insert(WorkspaceEventHead).values(workspace_id=WS, last_seq=seq))
        connection.execute(
            insert(ActivityEvent).values(
                workspace_id=WS,
                workspace_seq=seq,
                session_id="s1",
                event_type="message_update",
                payload=event.SerializeToString(),
                created_at_unix_ms=1,
            )
        )
    watcher = Watcher(host.server.channel, WS, after_event_id=0)
    watcher.wait_ready()
    watcher.wait_done()
    assert watcher.error is not None
    code, reason, _, _ = error_of(lambda: _raise(watcher.error))
    assert (code, reason) == (grpc.StatusCode.OUT_OF_RANGE, "CURSOR_BOUND_EXCEEDED")
    assert all(e.WhichOneof("event") != "message_update" for e in watcher.events)


def _raise(error: BaseException | None) -> None:
    assert error is not None
    raise error


def _patch(**fields: Any) -> runtime_pb2.ReportItem:
    return runtime_pb2.ReportItem(session_patch=runtime_pb2.SessionPatch(**fields))


@pytest.mark.spec("SEC-2", "SEC-4", "HOST-RT-1")
def test_a_report_with_an_unknown_enum_or_nul_is_rejected_and_the_link_stays_up(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    before = snapshot(engine, WS, ["s1"])
    phase = turn_patch(
        "t1", canonical_pb2.TURN_PHASE_RUNNING, origin=canonical_pb2.TURN_ORIGIN_USER
    )
    phase.turn_patch.phase = 42  # type: ignore[assignment]
    tool = runtime_pb2.ReportItem(
        message_snapshot=runtime_pb2.MessageSnapshot(
            message_id="tool-1",
            role=canonical_pb2.MESSAGE_ROLE_ASSISTANT,
            kind=canonical_pb2.MESSAGE_KIND_TOOL_CALL,
            tool_call=runtime_pb2.ToolCallSnapshot(call_id="c", tool_name="Bash"),
        )
    )
    tool.message_snapshot.tool_call.steps.add(call_id="inner").phase = 9  # type: ignore[assignment]
    result = runtime.report(
        WS, "s1", "r-bad", _patch(title="fine"), tool, phase, _patch(title="a\x00b")
    )
    assert (result.outcome, result.reason) == (REJECTED, link.INVALID_FIELD_VALUE)
    assert [r.index for r in result.item_results] == [1, 2, 3]
    assert "items[1].message_snapshot.tool_call.steps[0].phase" in result.item_results[0].message
    assert "items[2].turn_patch.phase" in result.item_results[1].message
    assert "items[3].session_patch.title" in result.item_results[2].message
    assert snapshot(engine, WS, ["s1"]) == before
    assert runtime.error is None
    assert runtime.report(WS, "s1", "r-ok", _patch(title="fine")).outcome == APPLIED
    runtime.close()


def _target(host_stub: Any, session_id: str) -> str:
    response = host_stub.GetSession(
        host_pb2.GetSessionRequest(workspace_id=WS, session_id=session_id), metadata=DEVICE
    )
    target: str = response.session.agent_target_id
    return target


def _register(host_stub: Any, agent_target_id: str, provider: str) -> None:
    host_stub.RegisterAgentTarget(
        host_pb2.RegisterAgentTargetRequest(
            target=host_pb2.AgentTarget(
                agent_target_id=agent_target_id,
                provider=provider,
                display_name=agent_target_id,
                enabled=True,
                launch_ref=host_pb2.AgentLaunchRef(runtime_target_ref=f"{provider}:x"),
            )
        ),
        metadata=ADMIN,
    )


@pytest.mark.spec("HOST-SES-1", "HOST-RT-3", "SEC-2")
def test_a_report_never_clears_the_target_and_names_only_a_registered_one(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    _register(host.stub, "other-provider-target", "another-provider")
    _register(host.stub, "demo-2", PROVIDER)
    emptied = runtime.report(WS, "s1", "r1", _patch(agent_target_id="", title="renamed"))
    assert emptied.outcome == APPLIED, emptied
    assert _target(host.stub, "s1") == TARGET_ID
    before = snapshot(engine, WS, ["s1", "child"])
    for number, (target, reason) in enumerate(
        [
            ("nope", link.UNKNOWN_AGENT_TARGET),
            ("other-provider-target", link.AGENT_TARGET_PROVIDER_MISMATCH),
        ]
    ):
        for session_id, patch in (
            ("s1", _patch(agent_target_id=target, title="x")),
            ("child", _patch(parent_session_id="s1", agent_target_id=target)),
        ):
            result = runtime.report(WS, session_id, f"r-{session_id}-{number}", patch)
            assert (result.outcome, result.reason) == (REJECTED, reason), result
    assert snapshot(engine, WS, ["s1", "child"]) == before
    assert _target(host.stub, "s1") == TARGET_ID
    moved = runtime.report(WS, "s1", "r-move", _patch(agent_target_id="demo-2"))
    assert moved.outcome == APPLIED, moved
    assert _target(host.stub, "s1") == "demo-2"
    assert runtime.error is None
    runtime.close()
