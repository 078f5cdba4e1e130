"""Reference metadata on user turns: validation, storage JSON and the wire codec (HOST-REF-1)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentactivity.canonical.v1 import canonical_pb2
from domainerrors import InvalidArgument
from services.host.turns.reference_metadata import (
    INVALID_REFERENCES,
    MAX_ACTIONS,
    MAX_REFERENCES,
    ReferenceMeta,
    ReferenceProvenance,
    decode_references,
    encode_references,
    reference_violations,
    validate_references,
)
from services.host.wire.references_codec import references_from_proto, references_to_proto

pytestmark = pytest.mark.spec("HOST-REF-1")

PROVENANCE = ReferenceProvenance("composer.paste", "2026-11-06T10:15:00Z", "user")
MINIMAL = ReferenceMeta("ref-1", "external_link", "https://example.com", PROVENANCE)
FULL = ReferenceMeta(
    id="3f7a-UUID-verbatim",
    kind="image",
    destination="screens/login.png",
    provenance=ReferenceProvenance(
        "workspace_resolver", "2026-11-06T10:15:00.123+01:00", "workspace", "ab" * 32
    ),
    mime="image/png",
    filename="login.png",
    size_bytes=48213,
    actions=("open", "reveal"),
)


def fields(references: list[ReferenceMeta]) -> list[str]:
    return [violation.field for violation in reference_violations(references)]


def test_valid_references_pass_unchanged() -> None:
    assert validate_references([MINIMAL, FULL]) == (MINIMAL, FULL)
    assert validate_references([]) == ()


def test_unknown_kinds_and_actions_are_valid_and_preserved() -> None:
    future = replace(MINIMAL, kind="hologram", actions=("download", "teleport"))
    assert validate_references([future]) == (future,)
    assert decode_references(encode_references([future])) == (future,)


def test_storage_json_is_camel_case_and_omits_absent_fields() -> None:
    raw = encode_references([MINIMAL, FULL])
    assert raw is not None
    minimal, full = json.loads(raw)
    assert minimal == {
        "id": "ref-1",
        "kind": "external_link",
        "destination": "https://example.com",
        "provenance": {
            "source": "composer.paste",
            "createdAt": "2026-11-06T10:15:00Z",
            "trust": "user",
        },
    }
    assert full == {
        "id": "3f7a-UUID-verbatim",
        "kind": "image",
        "destination": "screens/login.png",
        "mime": "image/png",
        "filename": "login.png",
        "sizeBytes": 48213,
        "provenance": {
            "source": "workspace_resolver",
            "createdAt": "2026-11-06T10:15:00.123+01:00",
            "trust": "workspace",
            "contentHash": "ab" * 32,
        },
        "actions": ["open", "reveal"],
    }
    assert " " not in raw.replace("2026-11-06T10:15:00Z", "")  # compact


def test_rows_without_references_read_back_as_an_empty_list() -> None:
    assert encode_references([]) is None
    assert decode_references(None) == ()
    assert decode_references("") == ()
    assert decode_references("[]") == ()


def test_stored_rows_read_back_exactly() -> None:
    assert decode_references(encode_references([MINIMAL, FULL])) == (MINIMAL, FULL)


def test_a_stored_row_written_by_an_older_build_reads_with_defaults() -> None:
    raw = '[{"id":"a","kind":"artifact","destination":"art-1","provenance":{"source":"s",'
    raw += '"createdAt":"2026-01-01","trust":"t"},"futureField":1,"actions":[]}]'
    (reference,) = decode_references(raw)
    assert reference == ReferenceMeta(
        "a", "artifact", "art-1", ReferenceProvenance("s", "2026-01-01", "t")
    )


def test_a_corrupt_row_is_an_error_not_silently_empty() -> None:
    with pytest.raises(ValueError):
        decode_references('{"id": "x"}')


@pytest.mark.parametrize(
    ("reference", "field"),
    [
        (replace(MINIMAL, id=""), "references[0].id"),
        (replace(MINIMAL, kind="  "), "references[0].kind"),
        (replace(MINIMAL, destination=""), "references[0].destination"),
        (replace(MINIMAL, provenance=None), "references[0].provenance"),
        (
            replace(MINIMAL, provenance=replace(PROVENANCE, source="")),
            "references[0].provenance.source",
        ),
        (
            replace(MINIMAL, provenance=replace(PROVENANCE, created_at="yesterday")),
            "references[0].provenance.created_at",
        ),
        (
            replace(MINIMAL, provenance=replace(PROVENANCE, created_at="")),
            "references[0].provenance.created_at",
        ),
        (
            replace(MINIMAL, provenance=replace(PROVENANCE, trust="")),
            "references[0].provenance.trust",
        ),
        (
            replace(MINIMAL, provenance=replace(PROVENANCE, content_hash="h" * 257)),
            "references[0].provenance.content_hash",
        ),
        (replace(MINIMAL, size_bytes=-1), "references[0].size_bytes"),
        (replace(MINIMAL, size_bytes=2**53), "references[0].size_bytes"),
        (replace(MINIMAL, destination="d" * 4097), "references[0].destination"),
        (replace(MINIMAL, mime="m" * 256), "references[0].mime"),
        (replace(MINIMAL, filename="é" * 513), "references[0].filename"),
        (replace(MINIMAL, actions=("open", "")), "references[0].actions[1]"),
        (replace(MINIMAL, actions=("a" * 65,)), "references[0].actions[0]"),
        (replace(MINIMAL, actions=("a",) * (MAX_ACTIONS + 1)), "references[0].actions"),
    ],
)
def test_each_invalid_field_is_reported_with_its_path(reference: ReferenceMeta, field: str) -> None:
    assert fields([reference]) == [field]


def test_paths_index_the_offending_reference() -> None:
    bad = replace(FULL, id="ref-3", provenance=replace(PROVENANCE, created_at="2026-13-45"))
    assert fields([MINIMAL, FULL, bad]) == ["references[2].provenance.created_at"]


def test_duplicate_ids_and_too_many_references_are_reported() -> None:
    assert fields([MINIMAL, FULL, MINIMAL]) == ["references[2].id"]
    many = [replace(MINIMAL, id=f"r{i}") for i in range(MAX_REFERENCES + 1)]
    assert fields(many) == ["references"]


def test_validation_raises_invalid_argument_with_every_violation() -> None:
    bad = replace(MINIMAL, id="ref-2", kind="", provenance=None)
    with pytest.raises(InvalidArgument) as raised:
        validate_references([MINIMAL, bad], field="initial_input.references")
    assert raised.value.reason == INVALID_REFERENCES
    assert [v.field for v in raised.value.field_violations] == [
        "initial_input.references[1].kind",
        "initial_input.references[1].provenance",
    ]


def test_the_codec_keeps_presence_of_optional_fields() -> None:
    messages = references_to_proto([MINIMAL, FULL])
    assert not messages[0].HasField("mime")
    assert not messages[0].HasField("size_bytes")
    assert not messages[0].provenance.HasField("content_hash")
    assert messages[1].size_bytes == 48213
    assert messages[1].provenance.content_hash == "ab" * 32
    assert references_from_proto(messages) == (MINIMAL, FULL)


def test_the_codec_maps_zero_values_that_are_present() -> None:
    zero = replace(MINIMAL, mime="", filename="", size_bytes=0)
    (message,) = references_to_proto([zero])
    assert message.HasField("size_bytes")
    assert message.HasField("mime")
    assert references_from_proto([message]) == (zero,)


def test_a_request_without_provenance_is_reported_by_the_validator() -> None:
    message = canonical_pb2.ReferenceMeta(id="a", kind="image", destination="x.png")
    (reference,) = references_from_proto([message])
    assert reference.provenance is None
    assert fields([reference]) == ["references[0].provenance"]


# ---------------------------------------------------------------------------- properties

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)
VALID = st.builds(
    ReferenceMeta,
    id=TEXT.filter(str.strip),
    kind=st.one_of(st.sampled_from(["image", "workspace_file", "change_set"]), TEXT).filter(
        str.strip
    ),
    destination=TEXT.filter(str.strip),
    provenance=st.builds(
        ReferenceProvenance,
        source=TEXT.filter(str.strip),
        created_at=st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
        trust=TEXT.filter(str.strip),
        content_hash=st.none() | TEXT,
    ),
    mime=st.none() | TEXT,
    filename=st.none() | TEXT,
    size_bytes=st.none() | st.integers(0, 2**53 - 1),
    actions=st.lists(TEXT.filter(str.strip), max_size=4).map(tuple),
)


@given(st.lists(VALID, max_size=5, unique_by=lambda r: r.id))
def test_valid_references_round_trip_through_storage_and_wire(
    references: list[ReferenceMeta],
) -> None:
    assert validate_references(references) == tuple(references)
    raw = encode_references(references)
    assert decode_references(raw) == tuple(references)
    assert references_from_proto(references_to_proto(references)) == tuple(references)
    for stored in json.loads(raw) if raw else []:
        assert None not in stored.values()
        assert stored.get("actions", ["x"]) != []
