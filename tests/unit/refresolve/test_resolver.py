"""The resolver's rules, against an in-memory backends port (REF-API-1 ... REF-FAIL-1)."""

from __future__ import annotations

import asyncio

import pytest

from domainerrors import (
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.refresolve.app_traversal import TraversalBounds
from services.refresolve.backends import Deadline, IssueOutputs
from services.refresolve.references import Resolution, ResolveRequest, Source
from services.refresolve.resolver import Resolver, effective_limit
from tests.unit.refresolve.fake_backends import FakeBackends, item


def _resolve(
    backends: FakeBackends,
    bounds: TraversalBounds | None = None,
    seconds: float = 10.0,
    **fields: object,
) -> Resolution:
    request = ResolveRequest(
        **{"workspace_id": "ws", "source": Source.APP, "id": "app", **fields}  # type: ignore[arg-type]
    )
    resolver = Resolver(backends, bounds or TraversalBounds())
    return asyncio.run(resolver.resolve(request, Deadline(seconds)))


def _paths(resolution: Resolution) -> list[str]:
    return [i.path for i in resolution.items]


TREE = FakeBackends(
    {
        None: [(["g1"], ["/root"]), (["g2"], ["/dup"])],
        "g1": [(["g11"], ["/g1/a", "/dup"])],
        "g11": [([], ["/g11/a"])],
        "g2": [([], ["/g2/a"]), ([], ["/dup", "/g2/b"])],
    }
)


@pytest.mark.spec("REF-APP-1")
def test_pre_order_over_every_page_whatever_the_concurrency() -> None:
    expected = ["/root", "/dup", "/g1/a", "/g11/a", "/g2/a", "/g2/b"]
    for concurrency in (1, 2, 8):
        backends = FakeBackends(TREE.containers, delay=0.001)
        resolution = _resolve(backends, TraversalBounds(concurrency=concurrency))
        assert _paths(resolution) == expected
        assert backends.calls == 6
        assert backends.max_concurrent <= concurrency


@pytest.mark.spec("REF-API-1")
def test_first_seen_wins_then_query_then_limit() -> None:
    backends = FakeBackends({None: [([], ["/x/Report.md", "/y/notes.md"])], "g": []})
    backends.containers[None] = [(["g"], ["/x/Report.md"])]
    backends.containers["g"] = [([], ["/x/Report.md", "/y/REPORT-2.md", "/y/other"])]
    assert _paths(_resolve(backends, query="report")) == ["/x/Report.md", "/y/REPORT-2.md"]
    limited = _resolve(backends, query="report", limit=1)
    assert (_paths(limited), limited.truncated) == (["/x/Report.md"], True)
    assert not _resolve(backends, limit=3).truncated


@pytest.mark.spec("REF-API-1")
def test_limit_semantics() -> None:
    assert effective_limit(None) == effective_limit(0) == 1000
    assert effective_limit(1) == 1
    assert effective_limit(10_000) == 1000
    with pytest.raises(InvalidArgument):
        effective_limit(-1)


@pytest.mark.spec("REF-API-1", "SEC-2")
def test_invalid_requests_list_every_field() -> None:
    with pytest.raises(InvalidArgument) as raised:
        _resolve(FakeBackends(), source=None, id="", group_id="", query="q" * 300, limit=-1)
    assert {v.field for v in raised.value.field_violations} == {
        "source",
        "id",
        "group_id",
        "query",
        "limit",
    }


@pytest.mark.spec("REF-BOUND-1")
def test_cycles_and_shared_groups_are_read_once() -> None:
    backends = FakeBackends(
        {None: [(["a", "b"], [])], "a": [(["b", "a"], ["/a"])], "b": [(["a"], ["/b"])]}
    )
    assert _paths(_resolve(backends)) == ["/a", "/b"]
    assert backends.calls == 3


@pytest.mark.spec("REF-BOUND-1")
def test_each_traversal_bound_fails_typed() -> None:
    chain: dict[str | None, list[tuple[list[str], list[str]]]] = {None: [(["g1"], [])]}
    chain.update({f"g{i}": [([f"g{i + 1}"], [])] for i in range(1, 5)})
    chain["g5"] = [([], ["/deep"])]
    for bounds, name in (
        (TraversalBounds(max_depth=4), "depth"),
        (TraversalBounds(max_groups=4), "groups"),
        (TraversalBounds(max_pages=5), "pages"),
    ):
        with pytest.raises(ResourceExhausted) as raised:
            _resolve(FakeBackends(chain), bounds)
        assert raised.value.reason == "TRAVERSAL_BOUND_EXCEEDED"
        assert raised.value.metadata["bound"] == name
    exact = TraversalBounds(max_depth=5, max_groups=5, max_pages=6)
    assert _paths(_resolve(FakeBackends(chain), exact)) == ["/deep"]


@pytest.mark.spec("REF-BOUND-1", "REF-TASK-1")
def test_topic_pages_are_bounded_and_truncated_issue_outputs_fail() -> None:
    backends = FakeBackends(topic_pages=[[item("/1")], [item("/2")], [item("/1")]])
    assert _paths(_resolve(backends, source=Source.TASK)) == ["/1", "/2"]
    with pytest.raises(ResourceExhausted) as raised:
        _resolve(
            FakeBackends(topic_pages=backends.topic_pages),
            TraversalBounds(max_pages=2),
            source=Source.TASK,
        )
    assert raised.value.metadata["bound"] == "pages"
    truncated = FakeBackends(issue=IssueOutputs((item("/1"),), truncated=True))
    with pytest.raises(ResourceExhausted) as raised:
        _resolve(truncated, source=Source.TASK, group_id="issue")
    assert raised.value.metadata["bound"] == "issue_outputs"
    whole = FakeBackends(issue=IssueOutputs((item("/1"), item("/1")), truncated=False))
    assert _paths(_resolve(whole, source=Source.TASK, group_id="issue")) == ["/1"]


@pytest.mark.spec("REF-FAIL-1")
def test_a_failure_on_page_3_fails_everything_and_cancels_the_rest() -> None:
    for concurrency in (1, 8):
        backends = FakeBackends(
            TREE.containers,
            fail_on_call=3,
            failure=Unavailable("down", reason="BACKEND_UNAVAILABLE"),
        )
        with pytest.raises(Unavailable):
            _resolve(backends, TraversalBounds(concurrency=concurrency))
    with pytest.raises(NotFound) as raised:
        _resolve(FakeBackends(TREE.containers), group_id="missing")
    assert raised.value.reason == "GROUP_NOT_FOUND"


@pytest.mark.spec("REF-FAIL-1")
def test_the_deadline_bounds_the_whole_resolution() -> None:
    slow = FakeBackends(TREE.containers, delay=0.05)
    with pytest.raises(DeadlineExceeded):
        _resolve(slow, TraversalBounds(concurrency=1), seconds=0.12)
    with pytest.raises(DeadlineExceeded):
        _resolve(FakeBackends(TREE.containers), seconds=0)


@pytest.mark.spec("REF-FAIL-1")
def test_zero_items_only_when_there_are_none() -> None:
    resolution = _resolve(FakeBackends({None: [([], [])]}))
    assert resolution == Resolution((), truncated=False)
