"""Opaque keyset page tokens bound to the request that produced them.

A token carries the keyset position after the last returned entry and a digest of the
request fields that define the listing (workspace, container, filter). Presenting it
with different fields is refused, so a token can never continue another listing; the
listing query itself still applies the request's workspace and container, so a forged
token cannot read outside them either. Page size is deliberately not bound: a caller
may change it between pages.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MalformedPageToken", "decode", "encode"]

_VERSION = 1


class MalformedPageToken(ValueError):
    """The token is not one this listing issued (malformed, or bound to another request)."""


def _binding_digest(binding: Mapping[str, str | None]) -> str:
    canonical = json.dumps(dict(sorted(binding.items())), separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def encode(binding: Mapping[str, str | None], position: Sequence[Any]) -> str:
    """Return the token continuing after ``position`` for the listing ``binding`` names.

    Args:
        binding: the request fields that define the listing.
        position: JSON-serializable keyset values of the last returned entry.
    """
    document = {"v": _VERSION, "b": _binding_digest(binding), "k": list(position)}
    raw = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode(token: str, binding: Mapping[str, str | None]) -> list[Any]:
    """Return the keyset position of ``token``.

    Raises:
        MalformedPageToken: the token is malformed or was issued for another listing.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        document = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError, ValueError):
        raise MalformedPageToken("page_token is malformed") from None
    if (
        not isinstance(document, dict)
        or document.get("v") != _VERSION
        or not isinstance(document.get("k"), list)
    ):
        raise MalformedPageToken("page_token is malformed")
    if document.get("b") != _binding_digest(binding):
        raise MalformedPageToken("page_token belongs to another request")
    return list(document["k"])
