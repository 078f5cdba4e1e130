"""The on-disk layout of a Session's resources under one resource root (MAINT-OUT-1).

::

    <root>/sessions/<session>/sidecar                  runtime sidecar state (Session id only)
    <root>/sessions/<session>/attachments              copied attachments (Session id only)
    <root>/workspaces/<workspace>/sessions/<session>   per-workspace scratch directory
    <root>/global/agent-leases/<session>               the global agent lease (a directory)

The sidecar and attachment paths are keyed by Session id alone, like the runtime they model, so
a Session id reused in another workspace shares them; that is why their release asks whether
any Session still owns the id.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

__all__ = ["MAX_COMPONENT_BYTES", "ResourceLayout", "check_component"]

MAX_COMPONENT_BYTES = 255
"""Longest id accepted as one path component, in UTF-8 bytes (the common ``NAME_MAX``)."""


def check_component(value: str, what: str) -> str:
    r"""Return ``value`` if it is one safe path component, else raise ``ValueError``.

    Host validates ids before they get here; this is defense in depth, so that no id can name
    a path outside its place in the layout.

    Args:
        value: The id to use as a directory name.
        what: What the id is (``"session_id"``), for the message.

    Raises:
        ValueError: Empty, ``.`` or ``..``, containing ``/``, ``\``, NUL or another control
            character, not encodable as UTF-8, or longer than 255 bytes.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if value in (".", ".."):
        raise ValueError(f"{what} must not be '.' or '..'")
    if any(ch in "/\\" or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"{what} must not contain '/', '\\\\' or control characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} must be valid Unicode text") from None
    if size > MAX_COMPONENT_BYTES:
        raise ValueError(f"{what} must be at most {MAX_COMPONENT_BYTES} bytes")
    return value


class ResourceLayout:
    """Where a Session's resources live under one root directory (default <data_dir>/resources).

    Every method validates its ids (:func:`check_component`) and raises ``ValueError`` for an id
    that is not one safe path component.

    Args:
        root: The resource root; it need not exist yet.
    """

    def __init__(self, root: Path) -> None:
        self.root: Path = Path(root)

    def __repr__(self) -> str:
        return f"ResourceLayout({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResourceLayout) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # Relative forms: the release walks these from the root without following symlinks, and
    # error messages name them instead of absolute paths.

    @staticmethod
    def sidecar_parts(session_id: str) -> PurePosixPath:
        """``sessions/<sid>/sidecar``, relative to the root."""
        return PurePosixPath("sessions", check_component(session_id, "session_id"), "sidecar")

    @staticmethod
    def attachments_parts(session_id: str) -> PurePosixPath:
        """``sessions/<sid>/attachments``, relative to the root."""
        sid = check_component(session_id, "session_id")
        return PurePosixPath("sessions", sid, "attachments")

    @staticmethod
    def workspace_parts(workspace_id: str, session_id: str) -> PurePosixPath:
        """``workspaces/<ws>/sessions/<sid>``, relative to the root."""
        ws = check_component(workspace_id, "workspace_id")
        sid = check_component(session_id, "session_id")
        return PurePosixPath("workspaces", ws, "sessions", sid)

    @staticmethod
    def agent_lease_parts(session_id: str) -> PurePosixPath:
        """``global/agent-leases/<sid>``, relative to the root."""
        sid = check_component(session_id, "session_id")
        return PurePosixPath("global", "agent-leases", sid)

    def sidecar_dir(self, session_id: str) -> Path:
        """The runtime sidecar state directory of a Session id (not per workspace)."""
        return self.root.joinpath(*self.sidecar_parts(session_id).parts)

    def attachments_dir(self, session_id: str) -> Path:
        """The copied-attachments directory of a Session id (not per workspace)."""
        return self.root.joinpath(*self.attachments_parts(session_id).parts)

    def workspace_dir(self, workspace_id: str, session_id: str) -> Path:
        """The runtime's scratch directory of one Session in one workspace."""
        return self.root.joinpath(*self.workspace_parts(workspace_id, session_id).parts)

    def agent_lease(self, session_id: str) -> Path:
        """The global agent lease of a Session id (a directory)."""
        return self.root.joinpath(*self.agent_lease_parts(session_id).parts)
