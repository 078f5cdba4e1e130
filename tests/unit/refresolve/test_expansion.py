"""Finding and resolving mentions in issue/task detail text (REF-EXP-1)."""

from __future__ import annotations

import asyncio

import pytest

from domainerrors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from services.refresolve.app_traversal import TraversalBounds
from services.refresolve.backends import Deadline
from services.refresolve.expansion import Expansion, expand_mentions, find_occurrences
from services.refresolve.resolver import Resolver
from tests.unit.refresolve.fake_backends import FakeBackends

URI = "mention://workspace-reference/app?source=app&workspaceId=ws"


def _expand(text: str, backends: FakeBackends | None = None, **kw: object) -> list[Expansion]:
    resolver = Resolver(backends or FakeBackends({None: [([], ["/a"])]}), TraversalBounds())
    limit = kw.pop("limit", None)
    seconds = float(kw.pop("seconds", 10.0))  # type: ignore[arg-type]
    return asyncio.run(expand_mentions(resolver, "ws", text, limit, Deadline(seconds)))  # type: ignore[arg-type]


@pytest.mark.spec("REF-EXP-1")
def test_links_and_bare_uris_are_found_with_utf16_spans() -> None:
    text = f"𝄞 [Files]({URI}) then {URI}\n[app](mention://workspace-app/a) mention://agent-target/x"
    found = find_occurrences(text)
    assert [(o.uri, o.label) for o in found] == [(URI, "Files"), (URI, None)]
    link = f"[Files]({URI})"
    assert (found[0].start, found[0].end) == (3, 3 + len(link))  # 𝄞 is a surrogate pair
    second = 3 + len(link) + len(" then ")
    assert (found[1].start, found[1].end) == (second, second + len(URI))


@pytest.mark.spec("REF-EXP-1")
def test_each_occurrence_resolves_or_carries_its_own_failure() -> None:
    foreign = URI.replace("workspaceId=ws", "workspaceId=other")
    malformed = "mention://workspace-reference/app?source=nope&workspaceId=ws"
    missing = URI.replace("/app?", "/app?groupId=missing&")
    backends = FakeBackends({None: [([], ["/a"])]})
    expansions = _expand(f"{URI} {foreign} {malformed} {missing} {URI}", backends)
    assert [e.resolution is not None for e in expansions] == [True, False, False, False, True]
    assert backends.calls == 2, "identical URIs resolve once (plus the missing group)"
    failures = [e.failure for e in expansions[1:4]]
    assert [(f.status, f.reason) for f in failures if f] == [
        ("PERMISSION_DENIED", "WORKSPACE_SCOPE_MISMATCH"),
        ("INVALID_ARGUMENT", "MALFORMED_MENTION"),
        ("NOT_FOUND", "GROUP_NOT_FOUND"),
    ]
    assert expansions[2].handle is None
    assert expansions[3].handle is not None


@pytest.mark.spec("REF-EXP-1", "SEC-2")
def test_call_level_errors() -> None:
    with pytest.raises(InvalidArgument):
        _expand("x" * (1024 * 1024 + 1))
    with pytest.raises(InvalidArgument):
        _expand(URI, limit=-1)
    with pytest.raises(ResourceExhausted) as raised:
        _expand(" ".join([URI] * 101))
    assert raised.value.reason == "TOO_MANY_MENTIONS"
    assert _expand("no mentions here") == []
    with pytest.raises(DeadlineExceeded):
        _expand(URI, seconds=0)
