"""Releasing a purged Session's resources, one resource-cleanup outbox row at a time (MAINT-OUT-1).

Per row (HOST-CLEAN-1) there are three resource classes, each released or kept on its own:

* ``session`` — the sidecar state and copied-attachments directories, keyed by Session id only:
  deleted only when no live or tombstoned Session in any workspace owns the id
  (``id_owned_anywhere`` false). The emptied ``sessions/<sid>`` directory goes with them.
* ``workspace`` — the per-workspace scratch directory: always deleted. The
  ``workspaces/<ws>/sessions`` skeleton stays, so a runtime creating another Session's scratch
  directory in the same workspace never races a cleanup removing its parents.
* ``agent_lease`` — the global releaser's per-Session lease: released unless a live Session in
  another workspace owns the id (``live_owner_in_other_workspace``).

Releasing is idempotent: a path already gone is success, so several workspace rows for one id,
or a retry after a partial failure, release nothing twice. Paths are walked from the root one
component at a time with ``O_NOFOLLOW`` directory descriptors and removed relative to them
(``shutil.rmtree(..., dir_fd=...)``), so no symlink is ever followed: a symlink standing at a
resource path is unlinked (its target survives), and one standing at a parent inside the root
fails that class instead of being followed. Nothing outside the four layout paths is touched, so
managed worktrees — which live elsewhere — are never reached.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from session_resources.layout import ResourceLayout

__all__ = [
    "AGENT_LEASE",
    "SESSION",
    "WORKSPACE",
    "CleanupFacts",
    "ReleaseOutcome",
    "ResourceReleaseError",
    "release_resources",
]

SESSION = "session"
"""Resource class of the Session-id-keyed sidecar and attachments directories."""
WORKSPACE = "workspace"
"""Resource class of the workspace-keyed scratch directory."""
AGENT_LEASE = "agent_lease"
"""Resource class of the global releaser (the per-Session agent lease)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# A parent directory that cannot be pruned because it is in use or already gone is fine.
_PRUNE_IGNORED = {errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR}


@dataclass(frozen=True)
class CleanupFacts:
    """One resource-cleanup row with Host's two ownership facts about its Session id.

    Attributes:
        workspace_id: Workspace of the purged Session (the row's key with ``session_id``).
        session_id: The purged Session's id.
        id_owned_anywhere: A live or tombstoned Session in any workspace owns this id.
        live_owner_in_other_workspace: A live Session in another workspace owns this id.
    """

    workspace_id: str
    session_id: str
    id_owned_anywhere: bool
    live_owner_in_other_workspace: bool


@dataclass(frozen=True)
class ReleaseOutcome:
    """What one :func:`release_resources` call did, by resource class.

    Attributes:
        released: Classes whose release ran and succeeded, in the order ``session``,
            ``workspace``, ``agent_lease``. A class counts as released when nothing of it is
            left, including when it was already gone (a repeated row releases the same classes
            again and deletes nothing new).
        kept: Classes kept because a Session still owns the id.
    """

    released: tuple[str, ...]
    kept: tuple[str, ...]


class ResourceReleaseError(Exception):
    """A resource could not be released.

    The message is short and sanitized: no stack, no absolute path, only the layout-relative
    path (``workspaces/ws-1/sessions/s-1``) and the error code (``EACCES (Permission denied)``).

    Every class was still attempted: ``outcome`` tells what was released and kept meanwhile,
    ``failed`` which classes failed. The caller keeps the row and retries it later; classes
    already released are then simply found gone.

    Attributes:
        failed: The classes that failed.
        outcome: The classes released or kept by the same call.
    """

    def __init__(
        self,
        message: str,
        failed: tuple[str, ...] = (),
        outcome: ReleaseOutcome | None = None,
    ) -> None:
        super().__init__(message)
        self.failed = failed
        self.outcome = outcome if outcome is not None else ReleaseOutcome((), ())


class _NotFollowed(Exception):
    """A parent of a resource path inside the root is a symlink; it is not followed."""

    def __init__(self, where: PurePosixPath) -> None:
        super().__init__(str(where))
        self.where = where


@dataclass(frozen=True)
class _Plan:
    name: str
    keep: bool
    remove: tuple[PurePosixPath, ...]
    prune: tuple[PurePosixPath, ...] = field(default=())


def release_resources(layout: ResourceLayout, facts: CleanupFacts) -> ReleaseOutcome:
    """Release the resources of one purged (workspace, Session) by the ownership facts.

    Synchronous file-system work: run it in a thread from async code. Each class is attempted
    even when an earlier one failed, so one failing class never holds the others back; the
    failures are raised together afterwards.

    Args:
        layout: Where the resources live.
        facts: The cleanup row and Host's ownership facts about its Session id.

    Returns:
        The classes released and the classes kept.

    Raises:
        ValueError: An id is not one safe path component (nothing was touched).
        ResourceReleaseError: At least one class could not be released (every class was
            attempted; ``outcome`` lists the rest).
    """
    plans = _plans(layout, facts)
    released: list[str] = []
    kept = [plan.name for plan in plans if plan.keep]
    failures: list[str] = []
    failed: list[str] = []
    root_fd = _open_root(layout, plans, kept)
    try:
        for plan in plans:
            if plan.keep:
                continue
            failure = _release(root_fd, plan)
            if failure is None:
                released.append(plan.name)
            else:
                failed.append(plan.name)
                failures.append(failure)
    finally:
        if root_fd is not None:
            os.close(root_fd)
    outcome = ReleaseOutcome(tuple(released), tuple(kept))
    if failures:
        message = "could not release " + "; ".join(failures)
        raise ResourceReleaseError(message, tuple(failed), outcome)
    return outcome


def _plans(layout: ResourceLayout, facts: CleanupFacts) -> tuple[_Plan, ...]:
    """What each resource class removes, and whether the ownership facts keep it."""
    sid = facts.session_id
    return (
        _Plan(
            SESSION,
            keep=facts.id_owned_anywhere,
            remove=(layout.sidecar_parts(sid), layout.attachments_parts(sid)),
            prune=(layout.sidecar_parts(sid).parent,),
        ),
        _Plan(
            WORKSPACE,
            keep=False,
            remove=(layout.workspace_parts(facts.workspace_id, sid),),
        ),
        _Plan(
            AGENT_LEASE,
            keep=facts.live_owner_in_other_workspace,
            remove=(layout.agent_lease_parts(sid),),
        ),
    )


def _open_root(layout: ResourceLayout, plans: tuple[_Plan, ...], kept: list[str]) -> int | None:
    """A descriptor of the resource root; ``None`` when there is none (nothing to release).

    Raises:
        ResourceReleaseError: The root exists but cannot be opened (every class not kept
            failed).
    """
    try:
        return os.open(layout.root, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None  # no root, no resources: every class is already released
    except OSError as error:
        names = tuple(plan.name for plan in plans if not plan.keep)
        raise ResourceReleaseError(
            f"could not open the resource root: {_why(error)}",
            failed=names,
            outcome=ReleaseOutcome((), tuple(kept)),
        ) from None


def _release(root_fd: int | None, plan: _Plan) -> str | None:
    """Remove one class's paths and prune its parents; the failure's message, if any."""
    current = plan.remove[0]
    try:
        if root_fd is not None:
            for current in plan.remove:
                _remove(root_fd, current)
            for current in plan.prune:
                _prune(root_fd, current)
    except _NotFollowed as refused:
        return f"{plan.name}: {refused.where} is a symbolic link, not followed"
    except OSError as error:
        return f"{plan.name}: {current}: {_why(error)}"
    return None


def _why(error: OSError) -> str:
    """A short, path-free reason: ``EACCES (Permission denied)``."""
    code = errno.errorcode.get(error.errno, "OSError") if error.errno else type(error).__name__
    return f"{code} ({error.strerror})" if error.strerror else code


def _open_parent(root_fd: int, relative: PurePosixPath) -> int | None:
    """An ``O_NOFOLLOW`` descriptor of ``relative``'s parent, or ``None`` if it does not exist.

    Raises:
        _NotFollowed: A component on the way is a symlink.
    """
    fd = os.dup(root_fd)
    walked = PurePosixPath()
    try:
        for part in relative.parts[:-1]:
            walked /= part
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return None
            except NotADirectoryError:
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise _NotFollowed(walked) from None
                return None  # a file where a directory would be: nothing can be under it
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove(root_fd: int, relative: PurePosixPath) -> None:
    """Delete ``relative`` (a directory tree, a file or a symlink itself); gone is success."""
    parent = _open_parent(root_fd, relative)
    if parent is None:
        return
    name = relative.name
    try:
        try:
            mode = os.lstat(name, dir_fd=parent).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            _rmtree(name, parent)
        else:
            # A symlink is unlinked, never followed; a stray file is removed like a directory.
            try:
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                return
    finally:
        os.close(parent)


def _prune(root_fd: int, relative: PurePosixPath) -> None:
    """Remove the directory ``relative`` if it is empty."""
    parent = _open_parent(root_fd, relative)
    if parent is None:
        return
    try:
        os.rmdir(relative.name, dir_fd=parent)
    except OSError as error:
        if error.errno not in _PRUNE_IGNORED:
            raise
    finally:
        os.close(parent)


def _rmtree(name: str, parent: int) -> None:
    """``shutil.rmtree`` relative to ``parent`` (symlink-attack safe).

    Tolerates entries that a concurrent release removed first.
    """
    if sys.version_info >= (3, 12):

        def on_exc(_func: Callable[..., Any], _path: str, error: BaseException) -> None:
            if not isinstance(error, FileNotFoundError):
                raise error

        shutil.rmtree(name, dir_fd=parent, onexc=on_exc)
    else:

        def on_error(_func: Callable[..., Any], _path: str, info: Any) -> None:
            if not issubclass(info[0], FileNotFoundError):
                raise info[1]

        shutil.rmtree(name, dir_fd=parent, onerror=on_error)
