"""Metadata-only references on user turns (HOST-REF-1, seed 003).

A reference is the transcript card of an attachment (link, workspace file, generated
document, image, artifact, change set, or a future kind); no file bytes are ever stored.
``kind`` and ``actions`` are open vocabularies and are preserved verbatim (CON-6).
``provenance.created_at`` is an ISO-8601 string (the seed-fixed exception to CON-4) and is
stored as sent.

Storage form (``messages.references_json``): a compact JSON array, camelCase keys
(``id, kind, destination, mime, filename, sizeBytes, provenance{source, createdAt, trust,
contentHash}, actions``); absent optional fields and an empty ``actions`` are omitted; a
message without references stores ``NULL`` and reads back as an empty list.

Public API:
    ReferenceProvenance(source, created_at, trust, content_hash=None)
    ReferenceMeta(id, kind, destination, provenance, mime=None, filename=None,
        size_bytes=None, actions=())
    KNOWN_KINDS: the kinds the seed names (others are accepted and preserved).
    Limits: MAX_REFERENCES, MAX_ACTIONS and the per-field length bounds below.
    reference_violations(references, *, field="references") -> list[FieldViolation]
    validate_references(references, *, field="references") -> tuple[ReferenceMeta, ...]
        (raises ``domainerrors.InvalidArgument`` reason ``INVALID_REFERENCES``)
    reference_to_json(reference) -> dict, reference_from_json(value) -> ReferenceMeta
    encode_references(references) -> str | None
    decode_references(raw) -> tuple[ReferenceMeta, ...]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from domainerrors import FieldViolation, InvalidArgument

__all__ = [
    "INVALID_REFERENCES",
    "KNOWN_KINDS",
    "MAX_ACTIONS",
    "MAX_REFERENCES",
    "MAX_SIZE_BYTES",
    "ReferenceMeta",
    "ReferenceProvenance",
    "decode_references",
    "encode_references",
    "reference_from_json",
    "reference_to_json",
    "reference_violations",
    "validate_references",
]

KNOWN_KINDS = frozenset(
    {"external_link", "workspace_file", "generated_document", "image", "artifact", "change_set"}
)
"""Kinds named by seed 003; any other non-empty kind is preserved as a future value."""

INVALID_REFERENCES = "INVALID_REFERENCES"
"""ErrorInfo reason of :func:`validate_references`."""

MAX_REFERENCES = 64
"""References on one user message."""
MAX_ACTIONS = 32
"""Actions on one reference."""
MAX_SIZE_BYTES = 2**53 - 1
"""``size_bytes`` bound: exactly representable in JSON numbers read by JavaScript."""

# Per-field bounds in UTF-8 bytes: generous for real cards, small enough that a
# message's references stay far below the 1 MiB field bound (64 x ~10 KiB).
_MAX_BYTES = {
    "id": 256,
    "kind": 64,
    "destination": 4096,
    "mime": 255,
    "filename": 1024,
    "provenance.source": 256,
    "provenance.created_at": 64,
    "provenance.trust": 64,
    "provenance.content_hash": 256,
    "actions": 64,
}


@dataclass(frozen=True)
class ReferenceProvenance:
    """Where a reference came from and how far to trust it.

    Who produced it (``source``), when (``created_at``, ISO-8601), its trust label and, when
    known, the SHA-256 ``content_hash`` of the original bytes.
    """

    source: str
    created_at: str
    trust: str
    content_hash: str | None = None


@dataclass(frozen=True)
class ReferenceMeta:
    """One reference card.

    ``provenance`` is required; ``None`` only represents a request that omitted it, which
    :func:`validate_references` rejects.
    """

    id: str
    kind: str
    destination: str
    provenance: ReferenceProvenance | None
    mime: str | None = None
    filename: str | None = None
    size_bytes: int | None = None
    actions: tuple[str, ...] = field(default_factory=tuple)


def _is_iso8601(value: str) -> bool:
    # datetime.fromisoformat (3.11+) accepts the ISO-8601 profiles clients send,
    # including a trailing "Z" and a bare date; the string itself is stored verbatim.
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _too_long(value: str, key: str) -> bool:
    return len(value.encode("utf-8")) > _MAX_BYTES[key]


def _check_text(
    violations: list[FieldViolation], path: str, key: str, value: str | None, *, required: bool
) -> None:
    if value is None:
        if required:
            violations.append(FieldViolation(path, "is required"))
        return
    if required and not value.strip():
        violations.append(FieldViolation(path, "must not be empty"))
    elif _too_long(value, key):
        violations.append(FieldViolation(path, f"must be at most {_MAX_BYTES[key]} bytes"))


def _reference_violations(reference: ReferenceMeta, path: str) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    _check_text(violations, f"{path}.id", "id", reference.id, required=True)
    _check_text(violations, f"{path}.kind", "kind", reference.kind, required=True)
    _check_text(
        violations, f"{path}.destination", "destination", reference.destination, required=True
    )
    _check_text(violations, f"{path}.mime", "mime", reference.mime, required=False)
    _check_text(violations, f"{path}.filename", "filename", reference.filename, required=False)
    if reference.size_bytes is not None and not 0 <= reference.size_bytes <= MAX_SIZE_BYTES:
        violations.append(
            FieldViolation(f"{path}.size_bytes", f"must be between 0 and {MAX_SIZE_BYTES}")
        )
    provenance = reference.provenance
    if provenance is None:
        violations.append(FieldViolation(f"{path}.provenance", "is required"))
    else:
        prefix = f"{path}.provenance"
        _check_text(
            violations, f"{prefix}.source", "provenance.source", provenance.source, required=True
        )
        created_before = len(violations)
        _check_text(
            violations,
            f"{prefix}.created_at",
            "provenance.created_at",
            provenance.created_at,
            required=True,
        )
        if len(violations) == created_before and not _is_iso8601(provenance.created_at):
            violations.append(
                FieldViolation(f"{prefix}.created_at", "must be an ISO-8601 timestamp")
            )
        _check_text(
            violations, f"{prefix}.trust", "provenance.trust", provenance.trust, required=True
        )
        _check_text(
            violations,
            f"{prefix}.content_hash",
            "provenance.content_hash",
            provenance.content_hash,
            required=False,
        )
    if len(reference.actions) > MAX_ACTIONS:
        violations.append(FieldViolation(f"{path}.actions", f"at most {MAX_ACTIONS} actions"))
    for index, action in enumerate(reference.actions):
        action_path = f"{path}.actions[{index}]"
        if not action.strip():
            violations.append(FieldViolation(action_path, "must not be empty"))
        elif _too_long(action, "actions"):
            violations.append(
                FieldViolation(action_path, f"must be at most {_MAX_BYTES['actions']} bytes")
            )
    return violations


def reference_violations(
    references: Sequence[ReferenceMeta], *, field: str = "references"
) -> list[FieldViolation]:
    """Every problem of ``references``, with paths like ``references[2].provenance.created_at``.

    Checks: at most :data:`MAX_REFERENCES`; non-empty ``id``, ``kind``, ``destination``,
    ``provenance`` with non-empty ``source``, ISO-8601 ``created_at`` and ``trust``;
    per-field byte bounds; ``size_bytes`` in ``[0, 2^53-1]``; at most :data:`MAX_ACTIONS`
    non-empty actions; ids unique within the message. Unknown kinds and actions are
    valid.
    """
    violations: list[FieldViolation] = []
    if len(references) > MAX_REFERENCES:
        violations.append(FieldViolation(field, f"at most {MAX_REFERENCES} references"))
    first_index: dict[str, int] = {}
    for index, reference in enumerate(references):
        path = f"{field}[{index}]"
        violations.extend(_reference_violations(reference, path))
        if reference.id in first_index:
            violations.append(
                FieldViolation(f"{path}.id", f"duplicates {field}[{first_index[reference.id]}].id")
            )
        else:
            first_index[reference.id] = index
    return violations


def validate_references(
    references: Sequence[ReferenceMeta], *, field: str = "references"
) -> tuple[ReferenceMeta, ...]:
    """Return ``references`` unchanged when valid.

    Raises:
        InvalidArgument: reason ``INVALID_REFERENCES`` with every field violation.
    """
    violations = reference_violations(references, field=field)
    if violations:
        raise InvalidArgument(
            f"{len(violations)} invalid reference field(s); first: "
            f"{violations[0].field}: {violations[0].description}",
            field_violations=violations,
            reason=INVALID_REFERENCES,
        )
    return tuple(references)


# ---------------------------------------------------------------------------- storage


def reference_to_json(reference: ReferenceMeta) -> dict[str, Any]:
    """The camelCase JSON object of one (validated) reference."""
    if reference.provenance is None:
        raise ValueError("a stored reference needs provenance; validate first")
    value: dict[str, Any] = {
        "id": reference.id,
        "kind": reference.kind,
        "destination": reference.destination,
    }
    if reference.mime is not None:
        value["mime"] = reference.mime
    if reference.filename is not None:
        value["filename"] = reference.filename
    if reference.size_bytes is not None:
        value["sizeBytes"] = reference.size_bytes
    provenance: dict[str, Any] = {
        "source": reference.provenance.source,
        "createdAt": reference.provenance.created_at,
        "trust": reference.provenance.trust,
    }
    if reference.provenance.content_hash is not None:
        provenance["contentHash"] = reference.provenance.content_hash
    value["provenance"] = provenance
    if reference.actions:
        value["actions"] = list(reference.actions)
    return value


def _optional_str(value: Mapping[str, Any], key: str) -> str | None:
    item = value.get(key)
    return item if isinstance(item, str) else None


def reference_from_json(value: Mapping[str, Any]) -> ReferenceMeta:
    """Read one stored reference; missing optional fields read back as absent."""
    raw_provenance = value.get("provenance")
    provenance_map: Mapping[str, Any] = raw_provenance if isinstance(raw_provenance, dict) else {}
    size = value.get("sizeBytes")
    actions = value.get("actions")
    return ReferenceMeta(
        id=str(value.get("id", "")),
        kind=str(value.get("kind", "")),
        destination=str(value.get("destination", "")),
        mime=_optional_str(value, "mime"),
        filename=_optional_str(value, "filename"),
        size_bytes=size if isinstance(size, int) and not isinstance(size, bool) else None,
        provenance=ReferenceProvenance(
            source=str(provenance_map.get("source", "")),
            created_at=str(provenance_map.get("createdAt", "")),
            trust=str(provenance_map.get("trust", "")),
            content_hash=_optional_str(provenance_map, "contentHash"),
        ),
        actions=tuple(a for a in actions if isinstance(a, str))
        if isinstance(actions, list)
        else (),
    )


def encode_references(references: Sequence[ReferenceMeta]) -> str | None:
    """The ``messages.references_json`` value: compact UTF-8 JSON, or ``None`` when empty."""
    if not references:
        return None
    return json.dumps(
        [reference_to_json(reference) for reference in references],
        ensure_ascii=False,
        separators=(",", ":"),
    )


def decode_references(raw: str | None) -> tuple[ReferenceMeta, ...]:
    """Read ``messages.references_json``; ``NULL`` (rows without references) reads as ``()``.

    Raises:
        ValueError: the stored value is not a JSON array of objects (a corrupt row).
    """
    if raw is None or raw == "":
        return ()
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError("references_json must be a JSON array of objects")
    return tuple(reference_from_json(item) for item in value)
