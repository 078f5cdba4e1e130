"""Workspace-reference mention URIs: canonical format, tolerant parse, typed errors (REF-URI-1)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domainerrors import InvalidArgument
from services.refresolve.mention_uri import (
    BadPercentEncoding,
    BadSource,
    DuplicatedParameter,
    MalformedMention,
    MentionKindNotReference,
    MentionTooLong,
    MissingId,
    MissingWorkspace,
    ParsedMention,
    UnexpectedUriShape,
    WrongScheme,
    format_mention,
    parse_mention,
)
from services.refresolve.references import ReferenceHandle, Source


@pytest.mark.spec("REF-URI-1")
def test_the_formatter_emits_query_keys_in_lexicographic_order() -> None:
    handle = ReferenceHandle(Source.TASK, "topic-1", "ws-1", "issue-7")
    assert format_mention(handle, count="3") == (
        "mention://workspace-reference/topic-1?count=3&groupId=issue-7&source=task&workspaceId=ws-1"
    )
    assert format_mention(ReferenceHandle(Source.APP, "a", "w")) == (
        "mention://workspace-reference/a?source=app&workspaceId=w"
    )


@pytest.mark.spec("REF-URI-1")
def test_the_parser_accepts_any_key_order() -> None:
    pairs = ["count=2", "groupId=g", "source=app", "workspaceId=ws-1"]
    expected = ParsedMention(ReferenceHandle(Source.APP, "app-1", "ws-1", "g"), "2")
    for order in itertools.permutations(pairs):
        uri = "mention://workspace-reference/app-1?" + "&".join(order)
        assert parse_mention(uri) == expected


@pytest.mark.spec("REF-URI-1")
def test_legacy_and_unknown_parameters_are_ignored_and_never_emitted() -> None:
    uri = (
        "mention://workspace-reference/app-1?files=%5B%22%2Fa%22%5D&source=app&path=%zz"
        "&command=rm&workspaceId=ws-1&files=again&token=secret"
    )
    parsed = parse_mention(uri)
    assert parsed == ParsedMention(ReferenceHandle(Source.APP, "app-1", "ws-1"))
    assert format_mention(parsed.handle) == (
        "mention://workspace-reference/app-1?source=app&workspaceId=ws-1"
    )


MALFORMED = [
    ("https://workspace-reference/a?source=app&workspaceId=w", WrongScheme),
    ("workspace-reference/a?source=app&workspaceId=w", WrongScheme),
    ("mention:///a?source=app&workspaceId=w", UnexpectedUriShape),
    ("mention://workspace-reference/a/b?source=app&workspaceId=w", UnexpectedUriShape),
    ("mention://workspace-reference/a?source=app&workspaceId=w#frag", UnexpectedUriShape),
    ("mention://workspace-reference?source=app&workspaceId=w", MissingId),
    ("mention://workspace-reference/?source=app&workspaceId=w", MissingId),
    ("mention://workspace-reference/a?source=app", MissingWorkspace),
    ("mention://workspace-reference/a?source=app&workspaceId=", MissingWorkspace),
    ("mention://workspace-reference/a?workspaceId=w", BadSource),
    ("mention://workspace-reference/a?source=App&workspaceId=w", BadSource),
    ("mention://workspace-reference/a?source=file&workspaceId=w", BadSource),
    ("mention://workspace-reference/a?source=app&source=task&workspaceId=w", DuplicatedParameter),
    ("mention://workspace-reference/a?source=app&workspaceId=w&workspaceId=w", DuplicatedParameter),
    (
        "mention://workspace-reference/a?source=app&workspaceId=w&groupId=g&groupId=g",
        DuplicatedParameter,
    ),
    (
        "mention://workspace-reference/a?source=app&workspaceId=w&count=1&count=2",
        DuplicatedParameter,
    ),
    ("mention://workspace-reference/a%2?source=app&workspaceId=w", BadPercentEncoding),
    ("mention://workspace-reference/a?source=app&workspaceId=w%zz", BadPercentEncoding),
    ("mention://workspace-reference/a?source=app&workspaceId=%FF", BadPercentEncoding),
    ("mention://workspace-reference/a?source=app&workspaceId=w&groupId=", MalformedMention),
    ("mention://workspace-reference/" + "a" * 4096 + "?source=app&workspaceId=w", MentionTooLong),
]


@pytest.mark.spec("REF-URI-1", "SEC-2")
@pytest.mark.parametrize(("uri", "error"), MALFORMED)
def test_every_malformed_form_raises_its_typed_error(
    uri: str, error: type[MalformedMention]
) -> None:
    with pytest.raises(error) as raised:
        parse_mention(uri)
    assert type(raised.value) is error
    assert raised.value.reason == "MALFORMED_MENTION"
    assert raised.value.status == "INVALID_ARGUMENT"
    assert [v.field for v in raised.value.field_violations] == ["uri"]


@pytest.mark.spec("REF-URI-1")
@pytest.mark.parametrize(
    "kind", ["workspace-app", "workspace-issue", "agent-target", "agent-session", "other"]
)
def test_other_mention_kinds_are_not_references(kind: str) -> None:
    with pytest.raises(MentionKindNotReference) as raised:
        parse_mention(f"mention://{kind}/x?source=app&workspaceId=w")
    assert isinstance(raised.value, InvalidArgument)
    assert raised.value.reason == "MENTION_KIND_NOT_REFERENCE"


@pytest.mark.spec("REF-URI-1")
def test_a_plus_is_literal_and_reserved_characters_are_encoded() -> None:
    parsed = parse_mention("mention://workspace-reference/a+b?source=app&workspaceId=w%20x+y")
    assert (parsed.handle.id, parsed.handle.workspace_id) == ("a+b", "w x+y")
    uri = format_mention(ReferenceHandle(Source.APP, "a/b?c#d&e=f%", "ws:1 2"))
    assert uri == (
        "mention://workspace-reference/a%2Fb%3Fc%23d%26e%3Df%25?source=app&workspaceId=ws%3A1%202"
    )


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40) | st.sampled_from(
    ["/", "?", "#", "&", "=", "%", "+", " ", "%2F", "a/b?c=d&e#f", "é😀"]
)


@st.composite
def _handles(draw: st.DrawFn) -> tuple[ReferenceHandle, str | None]:
    handle = ReferenceHandle(
        source=draw(st.sampled_from(list(Source))),
        id=draw(_TEXT),
        workspace_id=draw(_TEXT),
        group_id=draw(st.none() | _TEXT),
    )
    return handle, draw(st.none() | _TEXT)


@pytest.mark.spec("REF-URI-1")
@given(_handles())
def test_format_then_parse_round_trips_any_handle(
    value: tuple[ReferenceHandle, str | None],
) -> None:
    handle, count = value
    uri = format_mention(handle, count=count)
    assert parse_mention(uri) == ParsedMention(handle, count)
    assert format_mention(parse_mention(uri).handle, count=count) == uri


@pytest.mark.spec("REF-URI-1")
@given(_handles(), st.permutations(range(4)), st.lists(st.sampled_from(["files=x", "p=%zz"])))
def test_parse_is_independent_of_key_order_and_extra_parameters(
    value: tuple[ReferenceHandle, str | None], order: list[int], extra: list[str]
) -> None:
    handle, count = value
    canonical = format_mention(handle, count=count)
    prefix, _, query = canonical.partition("?")
    pairs = query.split("&")
    shuffled = [pairs[i] for i in order if i < len(pairs)] + extra
    assert parse_mention(prefix + "?" + "&".join(shuffled)) == ParsedMention(handle, count)
