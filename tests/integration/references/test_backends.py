"""The store-backed AppCenter and IssueManager servers (REF-BACKEND-1), on both backends."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from agentactivity.appcenter.v1 import appcenter_pb2
from agentactivity.issuemanager.v1 import issuemanager_pb2
from tests.support.references import ADMIN, WS1, ReferenceSuite, artifact
from tests.support.rpc_errors import error_details
from tests.support.servers import auth_metadata

_error = error_details


def _list_all(
    suite: ReferenceSuite, page_size: int, **fields: Any
) -> tuple[list[str], list[str], int]:
    groups: list[str] = []
    files: list[str] = []
    token, pages = "", 0
    while True:
        page = suite.apps.ListReferences(
            appcenter_pb2.ListReferencesRequest(
                workspace_id="ws-1", page_size=page_size, page_token=token, **fields
            ),
            metadata=WS1,
        )
        pages += 1
        groups += [g.group_id for g in page.groups]
        files += [f.path for f in page.files]
        token = page.next_page_token
        if not token:
            return groups, files, pages


@pytest.mark.spec("REF-BACKEND-1", "REF-APP-1")
def test_app_listing_pages_groups_then_files_in_code_point_order(
    reference_suite: ReferenceSuite,
) -> None:
    names = ["/é", "/a", "/Z", "/B", "/a b", "/a-b"]
    reference_suite.load_apps(
        [
            {
                "appId": "app",
                "groups": [{"groupId": g} for g in ("b", "B", "a", "é")],
                "artifacts": [artifact(n) for n in names],
            }
        ]
    )
    expected_groups = sorted(["b", "B", "a", "é"])
    expected_files = sorted(names)
    for size in (1, 3, 4, 5, 100):
        groups, files, pages = _list_all(reference_suite, size, app_id="app")
        assert (groups, files) == (expected_groups, expected_files), size
        assert pages == -(-10 // size) or size >= 10
    # 0 means 100, above 1000 is clamped; negative is invalid.
    assert _list_all(reference_suite, 0, app_id="app")[2] == 1
    assert _list_all(reference_suite, 5000, app_id="app")[2] == 1
    with pytest.raises(grpc.RpcError) as raised:
        _list_all(reference_suite, -1, app_id="app")
    assert _error(raised.value)[0] == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.spec("REF-BACKEND-1")
def test_page_tokens_are_bound_to_the_listing_that_issued_them(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps(
        [
            {
                "appId": "app",
                "groups": [{"groupId": "g", "artifacts": [artifact(f"/{i}") for i in range(3)]}],
                "artifacts": [artifact(f"/{i}") for i in range(3)],
            }
        ]
    )
    first = reference_suite.apps.ListReferences(
        appcenter_pb2.ListReferencesRequest(workspace_id="ws-1", app_id="app", page_size=2),
        metadata=ADMIN,
    )
    assert first.next_page_token
    for other in (
        {"app_id": "app", "group_id": "g"},
        {"app_id": "other"},
        {"app_id": "app", "workspace_id": "ws-2"},
    ):
        fields: dict[str, Any] = {"workspace_id": "ws-1", **other}
        request = appcenter_pb2.ListReferencesRequest(**fields, page_token=first.next_page_token)
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.apps.ListReferences(request, metadata=ADMIN)
        assert _error(raised.value)[0] == grpc.StatusCode.INVALID_ARGUMENT, other
        assert "page_token" in _error(raised.value)[2]
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.apps.ListReferences(
            appcenter_pb2.ListReferencesRequest(
                workspace_id="ws-1", app_id="app", page_token="not-a-token"
            ),
            metadata=ADMIN,
        )
    assert _error(raised.value)[2] == {"page_token"}


@pytest.mark.spec("REF-BACKEND-1", "REF-APP-1", "SEC-1")
def test_app_containers_are_found_only_in_their_app_and_workspace(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_apps([{"appId": "a1", "groups": [{"groupId": "g"}]}, {"appId": "a2"}])
    reference_suite.load_apps([{"appId": "a3", "artifacts": [artifact("/x")]}], workspace="ws-2")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"app_id": "a3"}, "APP_NOT_FOUND"),
        ({"app_id": "a2", "group_id": "g"}, "GROUP_NOT_FOUND"),
        ({"app_id": "a1", "group_id": "nope"}, "GROUP_NOT_FOUND"),
    ]
    for fields, reason in cases:
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.apps.ListReferences(
                appcenter_pb2.ListReferencesRequest(workspace_id="ws-1", **fields), metadata=WS1
            )
        assert _error(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, reason)


@pytest.mark.spec("REF-BACKEND-1", "STORE-3", "SEC-2")
def test_load_apps_replaces_whole_trees_atomically_and_is_admin_only(
    reference_suite: ReferenceSuite,
) -> None:
    tree = {
        "appId": "a",
        "displayName": "A",
        "groups": [{"groupId": "g", "groups": [{"groupId": "h"}], "artifacts": [artifact("/1")]}],
        "artifacts": [artifact("/r")],
    }
    request = json_format.ParseDict(
        {"workspaceId": "ws-1", "apps": [tree]}, appcenter_pb2.LoadAppsRequest()
    )
    for _ in range(2):  # idempotent
        counts = reference_suite.apps.LoadApps(request, metadata=ADMIN)
        assert (counts.apps_loaded, counts.groups_loaded, counts.artifacts_loaded) == (1, 2, 2)
    assert _list_all(reference_suite, 10, app_id="a", group_id="g") == (["h"], ["/1"], 1)
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.apps.LoadApps(request, metadata=auth_metadata("ws1-device"))
    assert _error(raised.value)[:2] == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    bad = json_format.ParseDict(
        {
            "workspaceId": "ws-1",
            "apps": [
                {"appId": "a"},  # would empty app a
                {
                    "appId": "b",
                    "groups": [{"groupId": "x"}, {"groupId": "x"}],
                    "artifacts": [artifact("/d"), artifact("/d"), artifact("", sizeBytes=-1)],
                },
                {"appId": ""},
            ],
        },
        appcenter_pb2.LoadAppsRequest(),
    )
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.apps.LoadApps(bad, metadata=ADMIN)
    code, _, fields = _error(raised.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fields == {
        "apps[1].groups[1].group_id",
        "apps[1].artifacts[1].path",
        "apps[1].artifacts[2].path",
        "apps[1].artifacts[2].size_bytes",
        "apps[2].app_id",
    }
    assert _list_all(reference_suite, 10, app_id="a") == (["g"], ["/r"], 1), "nothing changed"
    reference_suite.load_apps([{"appId": "a", "artifacts": [artifact("/new")]}])
    assert _list_all(reference_suite, 10, app_id="a") == ([], ["/new"], 1)


@pytest.mark.spec("REF-BACKEND-1")
def test_load_bounds_and_delete_app(reference_suite: ReferenceSuite) -> None:
    deep: dict[str, object] = {"groupId": "g40"}
    for level in range(39, 0, -1):
        deep = {"groupId": f"g{level}", "groups": [deep]}
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.load_apps([{"appId": "deep", "groups": [deep]}])
    assert _error(raised.value)[2] == {"apps"}
    reference_suite.load_apps([{"appId": "a", "groups": [{"groupId": "g"}]}])
    delete = appcenter_pb2.DeleteAppRequest(workspace_id="ws-1", app_id="a")
    assert reference_suite.apps.DeleteApp(delete, metadata=ADMIN).deleted
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.apps.DeleteApp(delete, metadata=ADMIN)
    assert _error(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "APP_NOT_FOUND")
    delete.allow_missing = True
    assert not reference_suite.apps.DeleteApp(delete, metadata=ADMIN).deleted
    reference_suite.load_apps([{"appId": "a", "groups": [{"groupId": "g"}]}])  # ids reusable


TOPIC = {
    "topicId": "t",
    "title": "T",
    "issues": [
        {
            "issueId": "i-b",
            "title": "B",
            "detail": "see mention://workspace-reference/x?source=app&workspaceId=ws-1",
            "outputs": [
                artifact("/same", "old", outputId="o1", createdAtUnixMs=10),
                artifact("/same", "new", outputId="o2", createdAtUnixMs=20),
                artifact("/tie", "tie-z", outputId="z", createdAtUnixMs=30),
                artifact("/tie", "tie-a", outputId="a", createdAtUnixMs=30),
            ],
        },
        {
            "issueId": "i-a",
            "outputs": [
                artifact("/a1", "Report.MD", outputId="o1", createdAtUnixMs=30),
                artifact("/a2", outputId="o2", createdAtUnixMs=5),
            ],
        },
    ],
}


@pytest.mark.spec("REF-BACKEND-1", "REF-TASK-1")
def test_issue_detail_returns_latest_outputs_newest_first(reference_suite: ReferenceSuite) -> None:
    reference_suite.load_topics([TOPIC])
    detail = reference_suite.issues.GetIssueDetail(
        issuemanager_pb2.GetIssueDetailRequest(workspace_id="ws-1", issue_id="i-b", topic_id="t"),
        metadata=WS1,
    )
    assert detail.issue.detail == TOPIC["issues"][0]["detail"]  # type: ignore[index]
    assert [(o.output_id, o.display_name) for o in detail.latest_outputs] == [
        ("a", "tie-a"),
        ("o2", "new"),
    ]
    assert not detail.latest_outputs_truncated
    for fields in ({"issue_id": "nope"}, {"issue_id": "i-b", "topic_id": "other"}):
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.issues.GetIssueDetail(
                issuemanager_pb2.GetIssueDetailRequest(workspace_id="ws-1", **fields),
                metadata=WS1,
            )
        assert _error(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "ISSUE_NOT_FOUND")


def _search(suite: ReferenceSuite, page_size: int, **fields: str) -> list[tuple[str, str]]:
    hits: list[tuple[str, str]] = []
    token = ""
    while True:
        page = suite.issues.SearchIssueOutputs(
            issuemanager_pb2.SearchIssueOutputsRequest(
                workspace_id="ws-1", topic_id="t", page_size=page_size, page_token=token, **fields
            ),
            metadata=WS1,
        )
        hits += [(h.issue_id, h.output.output_id) for h in page.outputs]
        token = page.next_page_token
        if not token:
            return hits


@pytest.mark.spec("REF-BACKEND-1", "REF-TASK-1")
def test_topic_search_pages_latest_outputs_newest_first_with_stable_ties(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_topics([TOPIC])
    expected = [("i-a", "o1"), ("i-b", "a"), ("i-b", "o2"), ("i-a", "o2")]
    for size in (1, 2, 3, 0):
        assert _search(reference_suite, size) == expected
    assert _search(reference_suite, 1, query="report.md") == [("i-a", "o1")]
    page = reference_suite.issues.SearchIssueOutputs(
        issuemanager_pb2.SearchIssueOutputsRequest(workspace_id="ws-1", topic_id="t", page_size=1),
        metadata=WS1,
    )
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.issues.SearchIssueOutputs(
            issuemanager_pb2.SearchIssueOutputsRequest(
                workspace_id="ws-1", topic_id="t", query="x", page_token=page.next_page_token
            ),
            metadata=WS1,
        )
    assert _error(raised.value)[2] == {"page_token"}
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.issues.SearchIssueOutputs(
            issuemanager_pb2.SearchIssueOutputsRequest(workspace_id="ws-1", topic_id="nope"),
            metadata=WS1,
        )
    assert _error(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND")


@pytest.mark.spec("REF-BACKEND-1", "REF-TASK-1", "SEC-2")
def test_topic_search_bounds_its_free_text_query(reference_suite: ReferenceSuite) -> None:
    reference_suite.load_topics([TOPIC])
    assert _search(reference_suite, 0, query="r" * 256) == []  # at the bound: searched
    for query in ("r" * 257, "x" * (3 * 1024 * 1024)):
        with pytest.raises(grpc.RpcError) as raised:
            reference_suite.issues.SearchIssueOutputs(
                issuemanager_pb2.SearchIssueOutputsRequest(
                    workspace_id="ws-1", topic_id="t", query=query
                ),
                metadata=WS1,
            )
        assert _error(raised.value) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            {"query"},
        )


@pytest.mark.spec("REF-BACKEND-1", "STORE-3", "SEC-2")
def test_load_topics_replaces_topics_and_never_moves_issues(
    reference_suite: ReferenceSuite,
) -> None:
    reference_suite.load_topics([TOPIC])
    moved = {"topicId": "t2", "issues": [{"issueId": "i-a"}]}
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.load_topics([moved])
    assert _error(raised.value)[:2] == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "ISSUE_IN_OTHER_TOPIC",
    )
    # Replacing t in the same request frees i-a to move.
    reference_suite.load_topics([{"topicId": "t", "issues": []}, moved])
    assert _search(reference_suite, 10) == []
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.load_topics(
            [
                {
                    "topicId": "t3",
                    "issues": [
                        {
                            "issueId": "x",
                            "detail": "é" * (600 * 1024),
                            "outputs": [{"outputId": ""}],
                        },
                        {"issueId": "x"},
                    ],
                }
            ]
        )
    assert _error(raised.value)[2] == {
        "topics[0].issues[0].detail",
        "topics[0].issues[0].outputs[0].output_id",
        "topics[0].issues[0].outputs[0].path",
        "topics[0].issues[1].issue_id",
    }
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.issues.LoadTopics(
            issuemanager_pb2.LoadTopicsRequest(workspace_id="ws-1"), metadata=WS1
        )
    assert _error(raised.value)[:2] == (grpc.StatusCode.PERMISSION_DENIED, "ROLE_NOT_ALLOWED")
    delete = issuemanager_pb2.DeleteTopicRequest(workspace_id="ws-1", topic_id="t2")
    assert reference_suite.issues.DeleteTopic(delete, metadata=ADMIN).deleted
    with pytest.raises(grpc.RpcError) as raised:
        reference_suite.issues.DeleteTopic(delete, metadata=ADMIN)
    assert _error(raised.value)[:2] == (grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND")
    delete.allow_missing = True
    assert not reference_suite.issues.DeleteTopic(delete, metadata=ADMIN).deleted
