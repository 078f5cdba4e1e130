"""Conversion between ``canonical.v1.ReferenceMeta`` and the domain references (HOST-REF-1).

The only place that maps reference protos; proto3 ``optional`` presence becomes ``None``
and back, so absent fields stay absent end to end.

Public API:
    references_from_proto(messages) -> tuple[ReferenceMeta, ...]
    references_to_proto(references) -> list[canonical_pb2.ReferenceMeta]
"""

from __future__ import annotations

from collections.abc import Iterable

from agentactivity.canonical.v1 import canonical_pb2
from services.host.turns.reference_metadata import ReferenceMeta, ReferenceProvenance

__all__ = ["references_from_proto", "references_to_proto"]


def _from_proto(message: canonical_pb2.ReferenceMeta) -> ReferenceMeta:
    provenance: ReferenceProvenance | None = None
    if message.HasField("provenance"):
        wire = message.provenance
        provenance = ReferenceProvenance(
            source=wire.source,
            created_at=wire.created_at,
            trust=wire.trust,
            content_hash=wire.content_hash if wire.HasField("content_hash") else None,
        )
    return ReferenceMeta(
        id=message.id,
        kind=message.kind,
        destination=message.destination,
        provenance=provenance,
        mime=message.mime if message.HasField("mime") else None,
        filename=message.filename if message.HasField("filename") else None,
        size_bytes=message.size_bytes if message.HasField("size_bytes") else None,
        actions=tuple(message.actions),
    )


def references_from_proto(
    messages: Iterable[canonical_pb2.ReferenceMeta],
) -> tuple[ReferenceMeta, ...]:
    """Domain references of a request.

    A missing ``provenance`` becomes ``None`` so the validator reports
    ``references[i].provenance``.
    """
    return tuple(_from_proto(message) for message in messages)


def _to_proto(reference: ReferenceMeta) -> canonical_pb2.ReferenceMeta:
    message = canonical_pb2.ReferenceMeta(
        id=reference.id,
        kind=reference.kind,
        destination=reference.destination,
        actions=list(reference.actions),
    )
    if reference.mime is not None:
        message.mime = reference.mime
    if reference.filename is not None:
        message.filename = reference.filename
    if reference.size_bytes is not None:
        message.size_bytes = reference.size_bytes
    if reference.provenance is not None:
        provenance = message.provenance
        provenance.source = reference.provenance.source
        provenance.created_at = reference.provenance.created_at
        provenance.trust = reference.provenance.trust
        if reference.provenance.content_hash is not None:
            provenance.content_hash = reference.provenance.content_hash
    return message


def references_to_proto(
    references: Iterable[ReferenceMeta],
) -> list[canonical_pb2.ReferenceMeta]:
    """Wire references of a stored user message (absent optional fields stay unset)."""
    return [_to_proto(reference) for reference in references]
