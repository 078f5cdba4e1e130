"""A failed read behind ``@`` mentions only empties the Agents group (HOST-MENT-4).

Real host servers on both backends. The workspace file index fails for real: a workspace
root whose last component is longer than the file system allows (``ENAMETOOLONG``) cannot be
searched, so the local index cannot tell whether ``<root>/explorer`` exists. One test installs
an index that answers the first name and then fails (through ``services.host.app.build``'s
``workspace_index``), to show a failure part way through never yields a partly filtered group.
An unreadable catalog is a stored catalog that cannot be decoded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import Engine, select, update

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2
from domainerrors import Unavailable
from services.host import app as host_app
from services.host.turns.mentions import WorkspaceFileIndex
from services.host.turns.workspace_index import local_workspace_index
from store.models import DEPLOYMENT_WORKSPACE_KEY, AgentTarget, Message, Session
from tests.integration.host_activity import DEVICE, TARGET_ID, WS, HostUnderTest, start_host
from tests.support.host_sessions import HostClient, demo_target, error_of
from tests.support.servers import LiveServer


def unreadable_root(tmp_path: Path) -> str:
    """An existing directory plus one component too long to look up (ENAMETOOLONG)."""
    return str(tmp_path / ("x" * 300))


@pytest.fixture
def host(migrated_db_url: str, live_server: Callable[..., LiveServer]) -> HostClient:
    client = HostClient(live_server("host", database_url=migrated_db_url))
    target = demo_target()
    target.subagents.add(name="reviewer", description="Reviews")
    client.register(target)
    return client


def catalog(host: HostClient, **fields: Any) -> host_pb2.GetMentionCatalogResponse:
    response: host_pb2.GetMentionCatalogResponse = host.call(
        "GetMentionCatalog", host_pb2.GetMentionCatalogRequest(workspace_id="ws-1", **fields)
    )
    return response


def group(menu: host_pb2.GetMentionCatalogResponse) -> tuple[list[str], list[str], str | None]:
    reason = menu.unavailable_reason if menu.HasField("unavailable_reason") else None
    return [a.name for a in menu.agents], list(menu.shadowed_names), reason


@pytest.mark.spec("HOST-MENT-4", "HOST-MENT-1")
def test_an_unreadable_workspace_index_empties_only_the_agents_group(
    host: HostClient, tmp_path: Path
) -> None:
    readable = tmp_path / "ws"
    (readable / "reviewer").mkdir(parents=True)
    unreadable = unreadable_root(tmp_path)
    host.create(session_id="s-ok", cwd=str(readable))
    host.create(session_id="s-bad", cwd=unreadable)

    # The same catalog through a readable root: filtered as usual, no reason.
    assert group(catalog(host, session_id="s-ok")) == (["explorer"], ["reviewer"], None)
    assert group(catalog(host, agent_target_id="demo", cwd=str(readable))) == (
        ["explorer"],
        ["reviewer"],
        None,
    )
    # The index cannot be read: the call succeeds with an empty group and the reason.
    expected: tuple[list[str], list[str], str | None] = ([], [], "WORKSPACE_INDEX_UNAVAILABLE")
    assert group(catalog(host, session_id="s-bad")) == expected
    assert group(catalog(host, agent_target_id="demo", cwd=unreadable)) == expected
    # Plan mode lists no agents and reads no index: nothing is unavailable.
    plan = catalog(host, session_id="s-bad", mode=canonical_pb2.COMPOSER_MODE_PLAN)
    assert group(plan) == ([], [], None)


@pytest.mark.spec("HOST-MENT-4")
def test_an_undecodable_catalog_is_catalog_unavailable(
    host: HostClient, sync_engine: Engine, tmp_path: Path
) -> None:
    host.create(session_id="s-1", cwd=str(tmp_path))
    host.create(session_id="s-2", cwd=str(tmp_path))
    assert group(catalog(host, session_id="s-1")) == (["explorer", "reviewer"], [], None)
    with sync_engine.begin() as connection:
        connection.execute(
            update(Session).where(Session.session_id == "s-1").values(launch_subagents_json="{")
        )
        # One unreadable entry makes the whole catalog unreadable: never a partial list.
        connection.execute(
            update(Session)
            .where(Session.session_id == "s-2")
            .values(launch_subagents_json='[{"name": "explorer"}, {"title": "no name"}]')
        )
        connection.execute(
            update(AgentTarget)
            .where(
                AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
                AgentTarget.agent_target_id == "demo",
            )
            .values(subagent_catalog_json='{"name": "explorer"}')
        )
    expected: tuple[list[str], list[str], str | None] = ([], [], "CATALOG_UNAVAILABLE")
    assert group(catalog(host, session_id="s-1")) == expected
    assert group(catalog(host, session_id="s-2")) == expected
    assert group(catalog(host, agent_target_id="demo", cwd=str(tmp_path))) == expected
    # The catalog is checked first: an unreadable index does not change the reason.
    assert group(catalog(host, agent_target_id="demo", cwd=unreadable_root(tmp_path))) == expected


@pytest.mark.spec("HOST-MENT-4", "SEC-2")
def test_scope_errors_stay_errors_when_the_index_cannot_be_read(
    host: HostClient, tmp_path: Path
) -> None:
    unreadable = unreadable_root(tmp_path)
    host.create(session_id="gone", cwd=unreadable)
    host.call(
        "DeleteSessions",
        host_pb2.DeleteSessionsRequest(workspace_id="ws-1", session_ids=["gone"]),
    )
    cases: list[tuple[dict[str, Any], grpc.StatusCode, str]] = [
        ({"agent_target_id": "nope", "cwd": unreadable}, grpc.StatusCode.NOT_FOUND, ""),
        ({"session_id": "missing"}, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"),
        ({"session_id": "gone"}, grpc.StatusCode.NOT_FOUND, ""),
        ({"cwd": unreadable}, grpc.StatusCode.INVALID_ARGUMENT, ""),
        ({"session_id": "bad id"}, grpc.StatusCode.INVALID_ARGUMENT, ""),
    ]
    for fields, code, reason in cases:
        got_code, got_reason, _, _ = error_of(lambda fields=fields: catalog(host, **fields))  # type: ignore[misc]
        assert got_code == code, fields
        if reason:
            assert got_reason == reason, fields


class FailingAfterFirst:
    """An index that answers its first question from disk, then cannot be read."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, root: str | None) -> WorkspaceFileIndex:
        local = local_workspace_index(root)

        def is_entry(name: str) -> bool:
            self.asked.append(name)
            if len(self.asked) > 1:
                raise Unavailable("index went away", reason="WORKSPACE_INDEX_UNAVAILABLE")
            return local(name)

        return is_entry


@pytest.mark.spec("HOST-MENT-4")
def test_a_failure_part_way_through_never_yields_a_partly_filtered_group(
    migrated_db_url: str, live_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    index = FailingAfterFirst()
    server = live_server(
        "host",
        database_url=migrated_db_url,
        build=lambda settings: host_app.build(settings, workspace_index=index),
    )
    host = HostClient(server)
    target = demo_target()
    target.subagents.add(name="reviewer", description="Reviews")
    host.register(target)
    host.create(session_id="s-1", cwd=str(tmp_path))
    menu = catalog(host, session_id="s-1")
    # "explorer" was answered (not a file), "reviewer" failed: neither is offered.
    assert index.asked == ["explorer", "reviewer"]
    assert group(menu) == ([], [], "WORKSPACE_INDEX_UNAVAILABLE")


def _stored_user_row(engine: Engine, session_id: str) -> tuple[str | None, str | None]:
    with engine.connect() as connection:
        row = connection.execute(
            select(Message.command, Message.agent_mentions_json).where(
                Message.session_id == session_id, Message.role == "user"
            )
        ).one()
    return row.command, row.agent_mentions_json


def _create_on_target(host: HostUnderTest, session_id: str, cwd: str, **fields: Any) -> Any:
    return host.stub.CreateSession(
        host_pb2.CreateSessionRequest(
            workspace_id=WS, agent_target_id=TARGET_ID, session_id=session_id, cwd=cwd, **fields
        ),
        metadata=DEVICE,
    )


@pytest.mark.spec("HOST-MENT-4", "HOST-MENT-1", "HOST-MENT-2")
def test_an_unreadable_index_leaves_at_names_literal_at_send_time(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    tmp_path: Path,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    unreadable = unreadable_root(tmp_path)
    _create_on_target(host, "s-bad", unreadable)

    draft = "ask @explorer to look"
    sent = host.send(draft, "c1", session_id="s-bad")
    # The send went ahead, as typed: no rewrite, no agent mention stored or returned.
    assert sent.turn.client_submit_id == "c1"
    assert not sent.user_message.HasField("command")
    assert list(sent.user_message.agent_mentions) == []
    assert _stored_user_row(sync_engine, "s-bad") == (None, None)
    start = runtime.next_command().start_turn
    assert (start.turn_id, start.prompt) == (sent.turn.turn_id, draft)

    # /skill: tokens need no index: they are still rewritten, the @name stays literal.
    _create_on_target(host, "s-skill", unreadable)
    skill_draft = "/skill:review then ask @explorer"
    with_skill = host.send(skill_draft, "c2", session_id="s-skill")
    assert with_skill.user_message.command == skill_draft
    assert [m.skill_id for m in with_skill.user_message.skill_mentions] == ["review"]
    assert list(with_skill.user_message.agent_mentions) == []
    prompt = runtime.next_command().start_turn.prompt
    assert "Skill tool" in prompt
    assert "Task" not in prompt
    assert prompt.endswith(skill_draft)

    # The same draft on a Session whose root can be read is a delegation (HOST-MENT-1).
    _create_on_target(host, "s-ok", str(tmp_path))
    delegated = host.send(draft, "c3", session_id="s-ok")
    assert [m.name for m in delegated.user_message.agent_mentions] == ["explorer"]
    assert runtime.next_command().start_turn.prompt != draft
    runtime.close()


@pytest.mark.spec("HOST-MENT-4", "HOST-TURN-1")
def test_create_with_input_keeps_at_names_literal_when_the_index_cannot_be_read(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    tmp_path: Path,
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    draft = "@explorer map the retry policy"
    created = _create_on_target(
        host,
        "s-new",
        unreadable_root(tmp_path),
        initial_input=host_pb2.InitialInput(client_submit_id="c1", content=draft),
    )
    assert created.HasField("turn")
    assert _stored_user_row(sync_engine, "s-new") == (None, None)
    start = runtime.next_command().start_turn
    assert (start.turn_id, start.prompt) == (created.turn.turn_id, draft)
    runtime.close()


@pytest.mark.spec("HOST-MENT-4", "HOST-MENT-1")
def test_an_undecodable_launch_catalog_leaves_at_names_literal_at_send_time(
    migrated_db_url: str,
    live_server: Callable[..., LiveServer],
    sync_engine: Engine,
    tmp_path: Path,
) -> None:
    """A catalog the ``@`` menu hides as ``CATALOG_UNAVAILABLE`` delegates to no one either."""
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    _create_on_target(host, "s-broken", str(tmp_path))
    _create_on_target(host, "s-ok", str(tmp_path))
    # One entry without a name: a lenient read would still find "explorer" in it.
    with sync_engine.begin() as connection:
        connection.execute(
            update(Session)
            .where(Session.session_id == "s-broken")
            .values(launch_subagents_json='[{"name": "explorer"}, {"title": "no name"}]')
        )
    menu = host.stub.GetMentionCatalog(
        host_pb2.GetMentionCatalogRequest(workspace_id=WS, session_id="s-broken"), metadata=DEVICE
    )
    assert group(menu) == ([], [], "CATALOG_UNAVAILABLE")

    draft = "/skill:review then ask @explorer to look"
    sent = host.send(draft, "c1", session_id="s-broken")
    # The send went ahead; the skill is rewritten, the @name stays literal.
    assert [m.skill_id for m in sent.user_message.skill_mentions] == ["review"]
    assert list(sent.user_message.agent_mentions) == []
    assert _stored_user_row(sync_engine, "s-broken") == (draft, None)
    prompt = runtime.next_command().start_turn.prompt
    assert "Task" not in prompt
    assert prompt.endswith(draft)

    # The same draft where the catalog reads cleanly is a delegation to "explorer".
    delegated = host.send(draft, "c2", session_id="s-ok")
    assert [m.name for m in delegated.user_message.agent_mentions] == ["explorer"]
    assert "Task" in runtime.next_command().start_turn.prompt
    runtime.close()
