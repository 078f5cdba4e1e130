"""Reference resolution end to end through real AppCenter, IssueManager and refresolve servers.

Covers REF-API-1, REF-APP-1, REF-TASK-1, REF-BOUND-1, REF-FAIL-1, REF-EXP-1, REF-SKILL-1
and REF-URI-1 on the wire; every test runs on SQLite and Postgres.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from tests.support.references import (
    APP,
    TASK,
    WS1,
    FakeAppCenter,
    ReferenceSuite,
    artifact,
    start_refresolve,
)
from tests.support.servers import LiveServer, auth_metadata


def _reason(error: grpc.RpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return error.code(), info.reason, dict(info.metadata)
    return error.code(), "", {}


def _paths(response: Any) -> list[str]:
    return [item.path for item in response.items]


NESTED_APP = {
    "appId": "app-1",
    "displayName": "Reports",
    "artifacts": [artifact("/r/root.md"), artifact("/r/shared.md", "root-copy.md")],
    "groups": [
        {
            "groupId": "b",
            "displayName": "B",
            "artifacts": [artifact("/r/b1.md"), artifact("/r/shared.md", "b-copy.md")],
            "groups": [{"groupId": "b-inner", "artifacts": [artifact("/r/b-inner.md")]}],
        },
        {"groupId": "a", "displayName": "A", "artifacts": [artifact("/r/a1.md")]},
    ],
}


@pytest.mark.spec("REF-APP-1", "REF-API-1")
def test_app_source_walks_nested_groups_in_pre_order_and_deduplicates(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([NESTED_APP])
    response = reference_suite.list(source=APP, id="app-1")
    # Root files by path, then groups by id (a before b), depth first.
    assert _paths(response) == [
        "/r/root.md",
        "/r/shared.md",
        "/r/a1.md",
        "/r/b1.md",
        "/r/b-inner.md",
    ]
    shared = next(item for item in response.items if item.path == "/r/shared.md")
    assert shared.display_name == "root-copy.md", "the first item seen wins"
    assert not response.truncated
    narrowed = reference_suite.list(source=APP, id="app-1", group_id="b")
    assert _paths(narrowed) == ["/r/b1.md", "/r/shared.md", "/r/b-inner.md"]


def _many_files(prefix: str, count: int) -> list[dict[str, Any]]:
    return [artifact(f"{prefix}/f{index:04d}.txt") for index in range(count)]


@pytest.mark.spec("REF-APP-1", "REF-API-1")
def test_duplicate_paths_across_groups_and_pages_appear_once(
    reference_suite: ReferenceSuite,
) -> None:
    # 250 files per group: each group spans three backend pages of 100.
    shared = _many_files("/dup", 250)
    reference_suite.load_apps(
        [
            {
                "appId": "big",
                "groups": [
                    {"groupId": "g1", "artifacts": shared},
                    {"groupId": "g2", "artifacts": [*shared[100:], artifact("/dup/only-g2.txt")]},
                ],
            }
        ]
    )
    response = reference_suite.list(source=APP, id="big")
    paths = _paths(response)
    assert len(paths) == len(set(paths)) == 251
    assert paths[:250] == sorted(a["path"] for a in shared)
    assert paths[-1] == "/dup/only-g2.txt"


@pytest.mark.spec("REF-API-1")
def test_query_filters_after_deduplication_then_the_limit_truncates(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([NESTED_APP])
    # The first-seen copy of /r/shared.md is named root-copy.md: "b-copy" must not match it.
    assert _paths(reference_suite.list(source=APP, id="app-1", query="B-COPY")) == []
    assert _paths(reference_suite.list(source=APP, id="app-1", query="ROOT")) == [
        "/r/root.md",
        "/r/shared.md",
    ]
    limited = reference_suite.list(source=APP, id="app-1", limit=2)
    assert _paths(limited) == ["/r/root.md", "/r/shared.md"]
    assert limited.truncated
    exact = reference_suite.list(source=APP, id="app-1", limit=5)
    assert len(exact.items) == 5
    assert not exact.truncated


@pytest.mark.spec("REF-API-1")
def test_limit_zero_means_1000_and_larger_limits_are_clamped(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([{"appId": "huge", "artifacts": _many_files("/h", 1001)}])
    for limit in (None, 0, 5000):
        fields = {} if limit is None else {"limit": limit}
        response = reference_suite.list(source=APP, id="huge", **fields)
        assert len(response.items) == 1000
        assert response.truncated
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.list(source=APP, id="huge", limit=-1)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.spec("REF-TASK-1", "REF-API-1")
def test_task_source_uses_issue_latest_outputs_or_the_topic_search(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_topics(
        [
            {
                "topicId": "t-1",
                "issues": [
                    {
                        "issueId": "i-1",
                        "outputs": [
                            artifact("/t/notes.md", outputId="o1", createdAtUnixMs=100),
                            artifact(
                                "/t/notes.md", "notes-v2.md", outputId="o2", createdAtUnixMs=200
                            ),
                            artifact("/t/plan.md", outputId="o3", createdAtUnixMs=150),
                        ],
                    },
                    {
                        "issueId": "i-2",
                        "outputs": [
                            artifact("/t/notes.md", "other.md", outputId="o1", createdAtUnixMs=50),
                            artifact("/t/img.png", outputId="o2", createdAtUnixMs=300),
                        ],
                    },
                ],
            },
            {"topicId": "t-2", "issues": [{"issueId": "i-3"}]},
        ]
    )
    issue = reference_suite.list(source=TASK, id="t-1", group_id="i-1")
    assert _paths(issue) == ["/t/notes.md", "/t/plan.md"]
    assert issue.items[0].display_name == "notes-v2.md", "only the latest revision"
    topic = reference_suite.list(source=TASK, id="t-1")
    # Newest first across issues; i-2's older /t/notes.md is a duplicate path, dropped.
    assert _paths(topic) == ["/t/img.png", "/t/notes.md", "/t/plan.md"]
    assert topic.items[1].display_name == "notes-v2.md"
    assert _paths(reference_suite.list(source=TASK, id="t-2")) == []
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.list(source=TASK, id="t-2", group_id="i-1")
    assert _reason(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "ISSUE_NOT_FOUND")


@pytest.mark.spec("REF-FAIL-1")
def test_missing_containers_are_not_found_with_the_backend_reason(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([NESTED_APP, {"appId": "app-2", "groups": [{"groupId": "x"}]}])
    reference_suite.load_topics([{"topicId": "t-1", "issues": [{"issueId": "i-1"}]}])
    cases = [
        ({"source": APP, "id": "nope"}, "APP_NOT_FOUND"),
        ({"source": APP, "id": "app-1", "group_id": "nope"}, "GROUP_NOT_FOUND"),
        ({"source": APP, "id": "app-1", "group_id": "x"}, "GROUP_NOT_FOUND"),  # app-2's group
        ({"source": TASK, "id": "nope"}, "TOPIC_NOT_FOUND"),
        ({"source": TASK, "id": "t-1", "group_id": "nope"}, "ISSUE_NOT_FOUND"),
    ]
    for fields, reason in cases:
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.list(**fields)
        assert _reason(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, reason), fields


@pytest.mark.spec("REF-FAIL-1")
def test_resolution_is_live_artifacts_added_after_the_mention_appear(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([{"appId": "app-1", "groups": [{"groupId": "g"}]}])
    uri = "mention://workspace-reference/app-1?count=0&groupId=g&source=app&workspaceId=ws-1"
    request = refresolve_pb2.ResolveMentionRequest(workspace_id="ws-1", uri=uri)
    assert list(reference_suite.resolver.ResolveMention(request, metadata=WS1).items) == []
    reference_suite.load_apps(
        [{"appId": "app-1", "groups": [{"groupId": "g", "artifacts": [artifact("/new.md")]}]}]
    )
    again = reference_suite.resolver.ResolveMention(request, metadata=WS1)
    assert _paths(again) == ["/new.md"]
    reference_suite.load_apps([{"appId": "app-1", "groups": [{"groupId": "g"}]}])
    assert _paths(reference_suite.resolver.ResolveMention(request, metadata=WS1)) == []


@pytest.mark.spec("REF-API-1", "REF-URI-1")
def test_resolve_mention_returns_the_handle_and_ignores_presentation_and_legacy_parameters(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([NESTED_APP])
    uri = (
        "mention://workspace-reference/app-1?workspaceId=ws-1&files=%5B%22%2Fevil%22%5D"
        "&count=99&source=app&groupId=a&path=/etc/passwd"
    )
    response = reference_suite.resolver.ResolveMention(
        refresolve_pb2.ResolveMentionRequest(workspace_id="ws-1", uri=uri), metadata=WS1
    )
    assert response.handle == refresolve_pb2.ReferenceHandle(
        source=APP, id="app-1", group_id="a", workspace_id="ws-1"
    )
    assert _paths(response) == ["/r/a1.md"]


@pytest.mark.spec("REF-API-1", "REF-URI-1", "SEC-1")
def test_resolve_mention_rejects_other_kinds_malformed_uris_and_foreign_workspaces(
    reference_suite: ReferenceSuite,
) -> None:
    cases = [
        (
            "mention://workspace-app/app-1?workspaceId=ws-1",
            "ws-1",
            WS1,
            "MENTION_KIND_NOT_REFERENCE",
        ),
        ("mention://agent-session/s?workspaceId=ws-1", "ws-1", WS1, "MENTION_KIND_NOT_REFERENCE"),
        (
            "https://workspace-reference/a?source=app&workspaceId=ws-1",
            "ws-1",
            WS1,
            "MALFORMED_MENTION",
        ),
        (
            "mention://workspace-reference/a?source=file&workspaceId=ws-1",
            "ws-1",
            WS1,
            "MALFORMED_MENTION",
        ),
        ("mention://workspace-reference/a?source=app", "ws-1", WS1, "MALFORMED_MENTION"),
        (
            "mention://workspace-reference/a?source=app&workspaceId=ws-2",
            "ws-1",
            WS1,
            "WORKSPACE_SCOPE_MISMATCH",
        ),
        (
            "mention://workspace-reference/a?source=app&workspaceId=ws-2",
            "ws-2",
            WS1,
            "WORKSPACE_SCOPE_MISMATCH",
        ),
    ]
    for uri, workspace, metadata, reason in cases:
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.resolver.ResolveMention(
                refresolve_pb2.ResolveMentionRequest(workspace_id=workspace, uri=uri),
                metadata=metadata,
            )
        code, got, _ = _reason(raised.value)
        expected = (
            grpc.StatusCode.PERMISSION_DENIED
            if reason == "WORKSPACE_SCOPE_MISMATCH"
            else grpc.StatusCode.INVALID_ARGUMENT
        )
        assert (code, got) == (expected, reason), uri


@pytest.mark.spec("REF-API-1", "SEC-2")
def test_invalid_list_requests_name_their_fields(reference_suite: ReferenceSuite) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.list(id="", group_id="", query="q" * 257, limit=-3)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(raised.value)  # type: ignore[arg-type]
    assert status is not None
    fields: set[str] = set()
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields |= {v.field for v in bad.field_violations}
    assert fields == {"source", "id", "group_id", "query", "limit"}


@pytest.mark.spec("REF-EXP-1")
def test_expand_mentions_resolves_each_occurrence_with_the_same_resolver(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([NESTED_APP])
    good = "mention://workspace-reference/app-1?groupId=a&source=app&workspaceId=ws-1"
    missing = "mention://workspace-reference/gone?source=app&workspaceId=ws-1"
    text = (
        f"😀 See [A files]({good}) and {missing}\n"
        f"again {good} but not [app](mention://workspace-app/app-1?workspaceId=ws-1)."
    )
    response = reference_suite.resolver.ExpandMentions(
        refresolve_pb2.ExpandMentionsRequest(workspace_id="ws-1", text=text), metadata=WS1
    )
    assert [e.uri for e in response.expansions] == [good, missing, good]
    first, second, third = response.expansions
    assert (first.start, first.end) == (7, 7 + len(f"[A files]({good})"))  # 😀: 2 UTF-16 units
    assert first.label == "A files"
    assert not third.HasField("label")
    assert [i.path for i in first.resolved.items] == ["/r/a1.md"]
    assert third.resolved == first.resolved
    assert second.failure.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert second.failure.reason == "APP_NOT_FOUND"
    assert second.handle.id == "gone"


@pytest.mark.spec("REF-SKILL-1")
def test_the_reference_skill_is_served_read_only_with_its_routing_policy(
    reference_suite: ReferenceSuite,
) -> None:
    response = reference_suite.resolver.GetReferenceSkill(
        refresolve_pb2.GetReferenceSkillRequest(workspace_id="ws-1"), metadata=WS1
    )
    assert response.skill.name == "reference"
    assert response.skill.read_only
    assert response.routing_policy.mention_uri_prefix == "mention://workspace-reference/"
    assert response.routing_policy.skill_name == "reference"
    assert "tutti reference list" in response.skill.body_markdown
    assert len(response.revision) == 16


# --- failures of the backends (a scripted fake AppCenter) ------------------------------------


def _deep_pages() -> dict[str, list[tuple[list[str], list[str]]]]:
    return {
        "": [([], [f"/p1/{i}" for i in range(3)]), ([], ["/p2/x"]), ([], ["/p3/x"]), ([], ["/p4"])]
    }


@pytest.mark.spec("REF-FAIL-1", "REF-BOUND-1")
def test_a_backend_failing_on_page_3_fails_the_resolution_instead_of_a_partial_list(
    live_server: Callable[..., LiveServer],
    fake_appcenter: Callable[..., str],
) -> None:
    fake = FakeAppCenter(_deep_pages())
    fake.fail_on_call = 3
    refresolve = start_refresolve(live_server, fake_appcenter(fake), "127.0.0.1:1")
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    request = refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app")
    with pytest.raises(grpc.RpcError) as raised:
        resolver.ListReferences(request, metadata=WS1, timeout=10)
    code, reason, metadata = _reason(raised.value)
    assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE")
    assert metadata["backend"] == "appcenter"
    assert fake.calls == 3
    status = rpc_status.from_call(raised.value)  # type: ignore[arg-type]
    assert status is not None
    assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
    # A backend PERMISSION_DENIED (an inaccessible source) keeps its code.
    fake.calls = 0
    fake.fail_on_call = 1
    fake.fail_code = grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as raised:
        resolver.ListReferences(request, metadata=WS1, timeout=10)
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.spec("REF-FAIL-1")
def test_an_unreachable_backend_is_unavailable(live_server: Callable[..., LiveServer]) -> None:
    refresolve = start_refresolve(live_server, "127.0.0.1:1", "127.0.0.1:1")
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    for source in (APP, TASK):
        with pytest.raises(grpc.RpcError) as raised:
            resolver.ListReferences(
                refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=source, id="x"),
                metadata=WS1,
                timeout=10,
            )
        assert _reason(raised.value)[:2] == (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE")


@pytest.mark.spec("REF-FAIL-1")
def test_a_backend_that_never_answers_hits_the_callers_deadline(
    live_server: Callable[..., LiveServer],
    fake_appcenter: Callable[..., str],
) -> None:
    fake = FakeAppCenter(_deep_pages())
    fake.hang.set()
    refresolve = start_refresolve(live_server, fake_appcenter(fake), "127.0.0.1:1")
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    request = refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app")
    with pytest.raises(grpc.RpcError) as raised:
        resolver.ListReferences(request, metadata=WS1, timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.spec("REF-FAIL-1")
def test_the_configured_resolution_timeout_bounds_a_call_without_a_deadline(
    live_server: Callable[..., LiveServer],
    fake_appcenter: Callable[..., str],
) -> None:
    fake = FakeAppCenter(_deep_pages())
    fake.hang.set()
    refresolve = start_refresolve(
        live_server, fake_appcenter(fake), "127.0.0.1:1", refresolve_timeout_seconds=0.5
    )
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    request = refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app")
    with pytest.raises(grpc.RpcError) as raised:
        resolver.ListReferences(request, metadata=WS1, timeout=20)
    code, reason, metadata = _reason(raised.value)
    assert (code, reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    assert metadata == {"backend": "appcenter"}


@pytest.mark.spec("REF-BOUND-1")
def test_a_group_cycle_terminates_and_each_group_is_read_once(
    live_server: Callable[..., LiveServer],
    fake_appcenter: Callable[..., str],
) -> None:
    fake = FakeAppCenter(
        {
            "": [(["a"], ["/root"])],
            "a": [(["b"], ["/a"])],
            "b": [(["a", "b"], ["/b", "/a"])],
        }
    )
    refresolve = start_refresolve(live_server, fake_appcenter(fake), "127.0.0.1:1")
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    response = resolver.ListReferences(
        refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app"),
        metadata=WS1,
        timeout=10,
    )
    assert _paths(response) == ["/root", "/a", "/b"]
    assert fake.calls == 3


@pytest.mark.spec("REF-BOUND-1")
def test_exceeding_a_traversal_bound_is_resource_exhausted_never_partial(
    live_server: Callable[..., LiveServer],
    fake_appcenter: Callable[..., str],
) -> None:
    chain: dict[str, list[tuple[list[str], list[str]]]] = {"": [(["g1"], [])]}
    chain.update({f"g{i}": [([f"g{i + 1}"], [f"/{i}"])] for i in range(1, 6)})
    chain["g6"] = [([], ["/6"])]
    address = fake_appcenter(FakeAppCenter(chain))
    cases = [
        ({"refresolve_max_depth": 3}, "depth"),
        ({"refresolve_max_groups": 4}, "groups"),
        ({"refresolve_max_pages": 5}, "pages"),
    ]
    for overrides, bound in cases:
        refresolve = start_refresolve(live_server, address, "127.0.0.1:1", **overrides)
        resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
        with pytest.raises(grpc.RpcError) as raised:
            resolver.ListReferences(
                refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app"),
                metadata=WS1,
                timeout=10,
            )
        code, reason, metadata = _reason(raised.value)
        assert (code, reason, metadata["bound"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TRAVERSAL_BOUND_EXCEEDED",
            bound,
        )
    unbounded = start_refresolve(live_server, address, "127.0.0.1:1", refresolve_max_depth=6)
    response = refresolve_pb2_grpc.ReferenceServiceStub(unbounded.channel).ListReferences(
        refresolve_pb2.ListReferencesRequest(workspace_id="ws-1", source=APP, id="app"),
        metadata=WS1,
        timeout=10,
    )
    assert _paths(response) == [f"/{i}" for i in range(1, 7)]


@pytest.mark.spec("REF-BOUND-1")
def test_an_issue_whose_outputs_the_backend_truncated_is_a_bound_failure(
    live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    issuemanager = live_server(
        "issuemanager", database_url=migrated_db_url, issuemanager_detail_max_outputs=2
    )
    refresolve = start_refresolve(live_server, "127.0.0.1:1", issuemanager.address)
    suite = ReferenceSuite(issuemanager, issuemanager, refresolve)
    outputs = [artifact(f"/o{i}", outputId=f"o{i}") for i in range(3)]
    suite.load_topics([{"topicId": "t", "issues": [{"issueId": "i", "outputs": outputs}]}])
    resolver = refresolve_pb2_grpc.ReferenceServiceStub(refresolve.channel)
    with pytest.raises(grpc.RpcError) as raised:
        resolver.ListReferences(
            refresolve_pb2.ListReferencesRequest(
                workspace_id="ws-1", source=TASK, id="t", group_id="i"
            ),
            metadata=auth_metadata("ws1-device"),
            timeout=10,
        )
    code, reason, metadata = _reason(raised.value)
    assert (code, reason, metadata["bound"]) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "TRAVERSAL_BOUND_EXCEEDED",
        "issue_outputs",
    )
