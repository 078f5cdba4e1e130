"""The workspace file-index port and its local file-system adapter (HOST-MENT-1, HOST-MENT-4).

``@name`` names a subagent only when the Session's workspace root holds no file or folder of
that name, so both the ``@`` menu (``GetMentionCatalog``) and send-time resolution
(``SendInput``, ``CreateSession`` with input) ask this port. Host builds one index per root
with :data:`WorkspaceIndexFactory`; ``HostContext.workspace_index`` holds the factory, so a
test host can install an index that fails.

A failed read is never an answer: the index raises :class:`domainerrors.Unavailable`
(reason :data:`WORKSPACE_INDEX_UNAVAILABLE`) and each caller degrades on its own terms
(HOST-MENT-4): the menu's Agents group becomes empty with ``unavailable_reason`` set, and a
send keeps every ``@name`` literal. :data:`INDEX_READ_ERRORS` are what such a failure is
caught as.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from domainerrors import Unavailable
from services.host.turns.mentions import WorkspaceFileIndex

__all__ = [
    "INDEX_READ_ERRORS",
    "INDEX_RETRY_SECONDS",
    "WORKSPACE_INDEX_UNAVAILABLE",
    "WorkspaceIndexFactory",
    "local_workspace_index",
]

WorkspaceIndexFactory = Callable[[str | None], WorkspaceFileIndex]
"""Builds the file-index port for one workspace root (``None``: no root known)."""

WORKSPACE_INDEX_UNAVAILABLE = "WORKSPACE_INDEX_UNAVAILABLE"
"""Reason of a failed index read (and the menu's ``unavailable_reason`` for it)."""

INDEX_RETRY_SECONDS = 5.0


INDEX_READ_ERRORS: tuple[type[Exception], ...] = (Unavailable, OSError)
"""What a failed index read raises: the port raises ``Unavailable``; an ``OSError`` an
adapter let through means the same. Anything else is a bug and propagates."""


def local_workspace_index(root: str | None) -> WorkspaceFileIndex:
    """Answer from the local file system whether ``root`` holds an entry called ``name``.

    A name that cannot be a single root entry (empty, ``.``, ``..``, containing a path
    separator) is no entry. A root that does not exist holds no entries. Any other error
    while looking (a root Host may not search, a name the file system refuses) is a failed
    read, not an absent entry.

    Raises (from the returned callable):
        Unavailable: reason ``WORKSPACE_INDEX_UNAVAILABLE`` when the root cannot be read.
    """

    def is_entry(name: str) -> bool:
        if root is None or not name or "/" in name or "\\" in name or name in {".", ".."}:
            return False
        try:
            # Path.exists() already answers False for a missing root or entry (ENOENT,
            # ENOTDIR); what reaches here is a real read failure.
            return (Path(root) / name).exists()
        except OSError as error:
            raise Unavailable(
                f"cannot read the workspace root: {error.strerror or error}",
                reason=WORKSPACE_INDEX_UNAVAILABLE,
                retry_after_seconds=INDEX_RETRY_SECONDS,
            ) from None

    return is_entry
