"""Bearer-token authentication: call metadata -> :class:`Principal` (SEC-1).

Tokens are configured in a YAML or JSON registry file that stores only SHA-256 digests
of the tokens, never the tokens themselves::

    tokens:
      - subject: alice-phone
        role: device            # device | service | admin
        workspaces: [ws-1]      # ["*"] alone declares a deployment-wide principal
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        not_after: 2027-01-31T00:00:00Z   # optional expiry: RFC 3339 or Unix seconds

``workspaces: ["*"]`` is the one declaration of a deployment-wide principal (it may act
in every workspace and on deployment-wide records); ``"*"`` cannot be mixed with named
workspaces. A token is refused as ``UNAUTHENTICATED`` ``EXPIRED_CREDENTIALS`` once the
clock is past its ``not_after``.

``tutti up`` writes such a file with a fresh random token into its data directory
(the safe local default); without a registry every call is refused.
"""

from __future__ import annotations

import contextvars
import datetime
import enum
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from domainerrors import InvalidArgument, PermissionDenied, Unauthenticated

WILDCARD_WORKSPACE = "*"


class Role(enum.StrEnum):
    """What kind of caller a principal is."""

    DEVICE = "device"
    SERVICE = "service"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    Attributes:
        subject: Stable name of the caller (for logs and audit).
        role: The caller's role.
        workspaces: Workspaces the caller may act in; ``{"*"}`` declares a
            deployment-wide principal.
        not_after: Unix seconds after which the token is expired; ``None`` never expires.
    """

    subject: str
    role: Role
    workspaces: frozenset[str]
    not_after: float | None = None

    @property
    def deployment_wide(self) -> bool:
        """Whether the principal is declared deployment-wide (``workspaces: ["*"]``)."""
        return WILDCARD_WORKSPACE in self.workspaces

    @property
    def scope(self) -> frozenset[str] | None:
        """The workspaces the principal may act in; ``None`` means every workspace.

        This is what an unset workspace on a scoped or cross-workspace RPC means: the
        principal's own workspaces, and all of them only for a deployment-wide principal.
        """
        return None if self.deployment_wide else self.workspaces

    def may_access(self, workspace_id: str) -> bool:
        """Return whether ``workspace_id`` is within the principal's scope."""
        return self.deployment_wide or workspace_id in self.workspaces

    def require_workspace(self, workspace_id: str, *, field: str = "workspace_id") -> None:
        """Raise unless ``workspace_id`` is a non-empty workspace the caller may use.

        Raises:
            InvalidArgument: ``workspace_id`` is empty.
            PermissionDenied: reason ``WORKSPACE_SCOPE_MISMATCH``.
        """
        if not workspace_id:
            raise InvalidArgument.for_field(field, "must name a workspace")
        if not self.may_access(workspace_id):
            raise PermissionDenied(
                f"{self.subject} may not act in workspace {workspace_id!r}",
                reason="WORKSPACE_SCOPE_MISMATCH",
                metadata={"workspace_id": workspace_id},
            )

    def require_role(self, *roles: Role) -> None:
        """Raise ``PermissionDenied`` (reason ``ROLE_NOT_ALLOWED``) unless the role fits."""
        if self.role not in roles:
            allowed = ", ".join(sorted(r.value for r in roles))
            raise PermissionDenied(
                f"role {self.role.value!r} may not call this method (allowed: {allowed})",
                reason="ROLE_NOT_ALLOWED",
            )


_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("tutti_principal")


def current_principal() -> Principal:
    """Return the principal of the RPC being served (set by the interceptor)."""
    try:
        return _current.get()
    except LookupError:  # pragma: no cover - only reachable when wiring is broken
        raise Unauthenticated("no authenticated principal for this call") from None


def bind_principal(principal: Principal) -> contextvars.Token[Principal]:
    """Make ``principal`` current for the running task (used by the interceptor)."""
    return _current.set(principal)


def unbind_principal(token: contextvars.Token[Principal]) -> None:
    """Undo :func:`bind_principal`."""
    _current.reset(token)


def token_digest(token: str) -> str:
    """Return the hex SHA-256 digest under which a token is registered."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_not_after(value: object, *, where: str) -> float:
    """Read a registry ``not_after``: RFC 3339 text (or a YAML timestamp) or Unix seconds.

    A timestamp without a UTC offset is refused rather than guessed.

    Raises:
        ValueError: The value is neither; the message names ``where``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{where}: 'not_after' must be an RFC 3339 timestamp or Unix seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        raise ValueError(f"{where}: 'not_after' needs a time and a UTC offset, not just a date")
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(
                f"{where}: 'not_after' must be an RFC 3339 timestamp or Unix seconds"
            ) from None
    if not isinstance(moment, datetime.datetime):
        raise ValueError(f"{where}: 'not_after' must be an RFC 3339 timestamp or Unix seconds")
    if moment.tzinfo is None:
        raise ValueError(f"{where}: 'not_after' needs a UTC offset (for example 'Z')")
    return moment.timestamp()


class TokenRegistry:
    """Maps presented bearer tokens to principals."""

    def __init__(
        self, entries: Mapping[str, Principal], *, clock: Callable[[], float] = time.time
    ) -> None:
        self._by_digest = dict(entries)
        self._clock = clock

    @classmethod
    def empty(cls) -> TokenRegistry:
        """A registry that authenticates nobody (fail closed)."""
        return cls({})

    @classmethod
    def from_file(cls, path: Path, *, clock: Callable[[], float] = time.time) -> TokenRegistry:
        """Load a YAML or JSON registry file (see the module docstring).

        Raises:
            ValueError: The file is malformed; the message names the entry.
        """
        text = path.read_text(encoding="utf-8")
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if not isinstance(document, dict) or not isinstance(document.get("tokens"), list):
            raise ValueError(f"{path}: expected a mapping with a 'tokens' list")
        return cls.from_entries(document["tokens"], origin=str(path), clock=clock)

    @classmethod
    def from_entries(
        cls,
        entries: Iterable[object],
        *,
        origin: str = "tokens",
        clock: Callable[[], float] = time.time,
    ) -> TokenRegistry:
        """Build a registry from already-parsed entries.

        Raises:
            ValueError: An entry is malformed; the message names it.
        """
        by_digest: dict[str, Principal] = {}
        for index, entry in enumerate(entries):
            where = f"{origin}: tokens[{index}]"
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected a mapping")
            digest = str(entry.get("sha256", "")).lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(f"{where}: 'sha256' must be 64 hex digits")
            try:
                role = Role(str(entry.get("role", "")))
            except ValueError:
                raise ValueError(f"{where}: 'role' must be device, service or admin") from None
            workspaces = entry.get("workspaces")
            if not isinstance(workspaces, list) or not all(isinstance(w, str) for w in workspaces):
                raise ValueError(f"{where}: 'workspaces' must be a list of strings")
            if WILDCARD_WORKSPACE in workspaces and len(set(workspaces)) > 1:
                raise ValueError(
                    f"{where}: '*' (deployment-wide) cannot be combined with named workspaces"
                )
            if any(not w.strip() for w in workspaces):
                raise ValueError(f"{where}: 'workspaces' must not contain an empty name")
            not_after = entry.get("not_after")
            expiry = None if not_after is None else parse_not_after(not_after, where=where)
            subject = str(entry.get("subject") or f"token-{index}")
            by_digest[digest] = Principal(subject, role, frozenset(workspaces), expiry)
        return cls(by_digest, clock=clock)

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> Principal:
        """Return the principal for the ``authorization: Bearer <token>`` metadata.

        Raises:
            Unauthenticated: the header is missing, malformed or names no known token
                (``MISSING_CREDENTIALS``, ``MALFORMED_CREDENTIALS``,
                ``INVALID_CREDENTIALS``), or the token is past its ``not_after``
                (``EXPIRED_CREDENTIALS``).
        """
        header = None
        for key, value in metadata or ():
            if key.lower() == "authorization":
                header = value.decode() if isinstance(value, bytes) else value
                break
        if header is None:
            raise Unauthenticated(
                "missing 'authorization: Bearer <token>' metadata", reason="MISSING_CREDENTIALS"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated(
                "authorization metadata must be 'Bearer <token>'", reason="MALFORMED_CREDENTIALS"
            )
        principal = self._by_digest.get(token_digest(token.strip()))
        if principal is None:
            raise Unauthenticated("unknown bearer token", reason="INVALID_CREDENTIALS")
        if principal.not_after is not None and self._clock() > principal.not_after:
            raise Unauthenticated("the bearer token has expired", reason="EXPIRED_CREDENTIALS")
        return principal
