"""The device state a Subscriber persists (LIVE-SUB-1): one JSON document.

The resume cursor, the attachment projection and the per-binding last revision are
saved *together*, in one atomic write: a cursor saved without the projection it goes
with would resume past an ``attachment_changed`` whose binding the device then no
longer knows, and a revision saved apart from the cursor could go backwards and make
the server refuse the next attach (``PROTOCOL_VIOLATION``).

Document shape (``"format": 1``)::

    {"format": 1,
     "device_id": "phone-1", "workspace_ids": ["ws-1"],
     "cursor": {"epoch": "e-9", "last_sequence": 41} | null,
     "revisions": {"screen-a": 3},
     "desired": {"screen-a": {"workspace_id": "ws-1", "session_id": "s-1",
                              "caller_turn_id": null}},
     "attachments": {"screen-a": {"revision": 3, "workspace_id": "ws-1", "session_id": "s-1",
                                  "caller_turn_id": null, "caught_up": false,
                                  "snapshot_seen": true, "snapshot_root_turn_id": "t-1",
                                  "canonical_turn_ids": [], "current_root_turn_id": null,
                                  "rejected_reason": null}}}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "STATE_FORMAT",
    "Attachment",
    "Cursor",
    "DesiredAttachment",
    "DeviceState",
    "FileStateStore",
    "MemoryStateStore",
    "StateCorruptError",
    "StateStore",
]

STATE_FORMAT = 1
"""Version of the JSON document; a document of another format is refused, not guessed."""


class StateCorruptError(Exception):
    """A saved state document cannot be read back (not JSON, wrong shape or format)."""


@dataclass(frozen=True)
class Cursor:
    """A resume cursor: the last delivery the device durably accepted (LIVE-RESUME-1)."""

    epoch: str
    last_sequence: int


@dataclass(frozen=True)
class DesiredAttachment:
    """What the application asked to be attached to a binding (re-sent on a fresh epoch)."""

    workspace_id: str
    session_id: str
    caller_turn_id: str | None = None


@dataclass
class Attachment:
    """The projection of one binding as the server announced it (LIVE-ATT-1).

    ``caught_up`` becomes true only at the matching ``attachment_caught_up`` barrier;
    until then (also across a resume, LIVE-SUB-1) the binding's baseline is incomplete.
    """

    revision: int
    workspace_id: str
    session_id: str
    caller_turn_id: str | None = None
    caught_up: bool = False
    snapshot_seen: bool = False
    """An ``interaction_snapshot`` of this revision was accepted."""
    snapshot_root_turn_id: str | None = None
    """That snapshot's ``root_turn_id`` (the barrier must name the same root)."""
    canonical_turn_ids: frozenset[str] = frozenset()
    """The barrier's authorization set (a set, never an order)."""
    current_root_turn_id: str | None = None
    """The barrier's ``current_interaction_root_turn_id``."""
    rejected_reason: str | None = None
    """Set when the server answered this revision with ``attachment_rejected``."""


@dataclass
class DeviceState:
    """Everything a device persists between calls and process runs."""

    device_id: str = ""
    workspace_ids: tuple[str, ...] = ()
    cursor: Cursor | None = None
    revisions: dict[str, int] = field(default_factory=dict)
    """Last revision sent (attach or detach) per binding; only ever grows."""
    desired: dict[str, DesiredAttachment] = field(default_factory=dict)
    attachments: dict[str, Attachment] = field(default_factory=dict)

    def copy(self) -> DeviceState:
        """A deep copy (through the JSON document, so it is exactly what would be saved)."""
        return DeviceState.from_json(self.to_json())

    def to_json(self) -> str:
        """The state as the JSON document of :data:`STATE_FORMAT`."""
        document: dict[str, Any] = {
            "format": STATE_FORMAT,
            "device_id": self.device_id,
            "workspace_ids": list(self.workspace_ids),
            "cursor": (
                None
                if self.cursor is None
                else {"epoch": self.cursor.epoch, "last_sequence": self.cursor.last_sequence}
            ),
            "revisions": dict(sorted(self.revisions.items())),
            "desired": {
                binding: {
                    "workspace_id": want.workspace_id,
                    "session_id": want.session_id,
                    "caller_turn_id": want.caller_turn_id,
                }
                for binding, want in sorted(self.desired.items())
            },
            "attachments": {
                binding: {
                    "revision": item.revision,
                    "workspace_id": item.workspace_id,
                    "session_id": item.session_id,
                    "caller_turn_id": item.caller_turn_id,
                    "caught_up": item.caught_up,
                    "snapshot_seen": item.snapshot_seen,
                    "snapshot_root_turn_id": item.snapshot_root_turn_id,
                    "canonical_turn_ids": sorted(item.canonical_turn_ids),
                    "current_root_turn_id": item.current_root_turn_id,
                    "rejected_reason": item.rejected_reason,
                }
                for binding, item in sorted(self.attachments.items())
            },
        }
        return json.dumps(document, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> DeviceState:
        """Read a document written by :meth:`to_json`.

        Raises:
            StateCorruptError: not JSON, another format, or a field of the wrong type.
        """
        try:
            document = json.loads(text)
            if not isinstance(document, dict) or document.get("format") != STATE_FORMAT:
                raise StateCorruptError(f"not a device state document of format {STATE_FORMAT}")
            return cls(
                device_id=_str(document["device_id"]),
                workspace_ids=tuple(_str(w) for w in _list(document["workspace_ids"])),
                cursor=_cursor(document["cursor"]),
                revisions={_str(b): _int(r) for b, r in _dict(document["revisions"]).items()},
                desired={
                    _str(b): DesiredAttachment(
                        workspace_id=_str(w["workspace_id"]),
                        session_id=_str(w["session_id"]),
                        caller_turn_id=_opt_str(w["caller_turn_id"]),
                    )
                    for b, w in _dict(document["desired"]).items()
                },
                attachments={
                    _str(b): _attachment(_dict(a))
                    for b, a in _dict(document["attachments"]).items()
                },
            )
        except StateCorruptError:
            raise
        except (ValueError, KeyError, TypeError) as error:
            raise StateCorruptError(f"unreadable device state: {error!r}") from None


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _opt_str(value: object) -> str | None:
    return None if value is None else _str(value)


def _int(value: object) -> int:
    # bool is an int subclass; a persisted true is not a revision.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {value!r}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {value!r}")
    return value


def _cursor(value: object) -> Cursor | None:
    if value is None:
        return None
    raw = _dict(value)
    cursor = Cursor(epoch=_str(raw["epoch"]), last_sequence=_int(raw["last_sequence"]))
    if not cursor.epoch or cursor.last_sequence < 0:
        raise ValueError(f"a cursor needs an epoch and last_sequence >= 0: {cursor}")
    return cursor


def _attachment(raw: dict[str, Any]) -> Attachment:
    return Attachment(
        revision=_int(raw["revision"]),
        workspace_id=_str(raw["workspace_id"]),
        session_id=_str(raw["session_id"]),
        caller_turn_id=_opt_str(raw["caller_turn_id"]),
        caught_up=_bool(raw["caught_up"]),
        snapshot_seen=_bool(raw["snapshot_seen"]),
        snapshot_root_turn_id=_opt_str(raw["snapshot_root_turn_id"]),
        canonical_turn_ids=frozenset(_str(t) for t in _list(raw["canonical_turn_ids"])),
        current_root_turn_id=_opt_str(raw["current_root_turn_id"]),
        rejected_reason=_opt_str(raw["rejected_reason"]),
    )


class StateStore(Protocol):
    """Where a Subscriber keeps its :class:`DeviceState` (thread-safe: saves run in a thread)."""

    def load(self) -> DeviceState | None:
        """The saved state, or ``None`` when nothing was saved yet.

        Raises:
            StateCorruptError: something was saved but cannot be read back.
        """
        ...

    def save(self, state: DeviceState) -> None:
        """Replace the saved state with ``state``, atomically."""
        ...


class MemoryStateStore:
    """A store in memory, for tests; it keeps the JSON text, so every save round-trips."""

    def __init__(self, text: str | None = None) -> None:
        self._lock = threading.Lock()
        self.text = text
        """The last saved document (``None`` before the first save)."""
        self.saves = 0
        """How many times :meth:`save` ran."""

    def load(self) -> DeviceState | None:
        """The saved state, or ``None``."""
        with self._lock:
            text = self.text
        return None if text is None else DeviceState.from_json(text)

    def save(self, state: DeviceState) -> None:
        """Keep ``state`` as its JSON text."""
        text = state.to_json()
        with self._lock:
            self.text = text
            self.saves += 1


class FileStateStore:
    """A store in one file, replaced atomically: a crash leaves the old or the new document.

    The document is written to a temporary file in the same directory, flushed and
    fsynced, then renamed over the target with :func:`os.replace`, and the directory is
    fsynced so the rename itself survives a power loss.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self) -> DeviceState | None:
        """The saved state, or ``None`` when the file does not exist."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as error:
            raise StateCorruptError(f"{self.path}: not UTF-8 text ({error})") from None
        return DeviceState.from_json(text)

    def save(self, state: DeviceState) -> None:
        """Write ``state`` to a temporary file, fsync it and rename it over the file."""
        data = state.to_json().encode("utf-8")
        directory = self.path.parent
        with self._lock:
            directory.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    # Without this the rename may be lost on power failure even though the data was
    # fsynced. Some platforms cannot open a directory; there the rename is the best we get.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
