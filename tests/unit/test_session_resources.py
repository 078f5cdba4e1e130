"""Session resources: the layout refuses hostile ids, and a release honours the ownership facts
per resource class, idempotently, without following symlinks or reaching worktrees (MAINT-OUT-1).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from session_resources import (
    CleanupFacts,
    ReleaseOutcome,
    ResourceLayout,
    ResourceReleaseError,
    release_resources,
)

pytestmark = pytest.mark.spec("MAINT-OUT-1")

WS, OTHER_WS, SID = "ws-1", "ws-2", "s-1"
ALL = ("session", "workspace", "agent_lease")


def _layout(tmp_path: Path) -> ResourceLayout:
    return ResourceLayout(tmp_path / "data" / "resources")


def _create(layout: ResourceLayout, ws: str = WS, sid: str = SID) -> dict[str, Path]:
    """Create every resource of (ws, sid) the way a runtime does; return one file of each."""
    files = {
        "sidecar": layout.sidecar_dir(sid) / "state.json",
        "attachment": layout.attachments_dir(sid) / "ref.json",
        "workspace": layout.workspace_dir(ws, sid) / "scratch.json",
        "agent_lease": layout.agent_lease(sid) / "lease.json",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    nested = layout.attachments_dir(sid) / "deep" / "er"
    nested.mkdir(parents=True)
    (nested / "x.bin").write_bytes(b"x")
    return files


def _facts(
    *, owned: bool = False, live_elsewhere: bool = False, ws: str = WS, sid: str = SID
) -> CleanupFacts:
    return CleanupFacts(
        workspace_id=ws,
        session_id=sid,
        id_owned_anywhere=owned,
        live_owner_in_other_workspace=live_elsewhere,
    )


def _exists(layout: ResourceLayout, ws: str = WS, sid: str = SID) -> dict[str, bool]:
    return {
        "sidecar": layout.sidecar_dir(sid).exists(),
        "attachments": layout.attachments_dir(sid).exists(),
        "workspace": layout.workspace_dir(ws, sid).exists(),
        "agent_lease": layout.agent_lease(sid).exists(),
    }


# ------------------------------------------------------------------------------ layout


def test_the_layout_places_each_resource_under_the_root(tmp_path: Path) -> None:
    layout = ResourceLayout(tmp_path)
    assert layout.root == tmp_path
    assert layout.sidecar_dir("s") == tmp_path / "sessions" / "s" / "sidecar"
    assert layout.attachments_dir("s") == tmp_path / "sessions" / "s" / "attachments"
    assert layout.workspace_dir("w", "s") == tmp_path / "workspaces" / "w" / "sessions" / "s"
    assert layout.agent_lease("s") == tmp_path / "global" / "agent-leases" / "s"
    # Ids that are odd but one safe component are accepted verbatim.
    assert layout.sidecar_dir("a.b:c@d").parent.name == "a.b:c@d"
    assert layout.sidecar_dir("é" * 127).parent.name == "é" * 127  # 254 bytes


HOSTILE = ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "a\x00b", "a\nb", "x" * 256, "é" * 128]


@pytest.mark.parametrize("bad", HOSTILE, ids=repr)
def test_the_layout_refuses_an_id_that_is_not_one_safe_path_component(
    tmp_path: Path, bad: str
) -> None:
    layout = ResourceLayout(tmp_path)
    calls: list[Callable[[], Path]] = [
        lambda: layout.sidecar_dir(bad),
        lambda: layout.attachments_dir(bad),
        lambda: layout.agent_lease(bad),
        lambda: layout.workspace_dir(bad, "s"),
        lambda: layout.workspace_dir("w", bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="_id must"):
            call()


def test_a_release_with_a_hostile_id_touches_nothing(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _create(layout)
    with pytest.raises(ValueError, match="session_id"):
        release_resources(layout, _facts(sid=".."))
    with pytest.raises(ValueError, match="workspace_id"):
        release_resources(layout, _facts(ws="../.."))
    assert all(_exists(layout).values())


# ----------------------------------------------------------------------------- release


def test_an_unowned_id_releases_every_class(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _create(layout)

    outcome = release_resources(layout, _facts())

    assert outcome == ReleaseOutcome(released=ALL, kept=())
    assert not any(_exists(layout).values())
    # The emptied per-id directory goes; the shared skeleton stays.
    assert not (layout.root / "sessions" / SID).exists()
    assert (layout.root / "sessions").is_dir()
    assert (layout.root / "workspaces" / WS / "sessions").is_dir()
    assert (layout.root / "global" / "agent-leases").is_dir()


def test_a_tombstoned_owner_keeps_the_session_keyed_resources_only(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    files = _create(layout)

    # A tombstone (restorable) in some workspace still owns the id; no live owner elsewhere.
    outcome = release_resources(layout, _facts(owned=True))

    assert outcome == ReleaseOutcome(released=("workspace", "agent_lease"), kept=("session",))
    assert files["sidecar"].exists()
    assert files["attachment"].exists()
    assert (layout.attachments_dir(SID) / "deep" / "er" / "x.bin").exists()
    assert not layout.workspace_dir(WS, SID).exists()
    assert not layout.agent_lease(SID).exists()


def test_a_live_owner_in_another_workspace_keeps_the_session_resources_and_the_lease(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path)
    _create(layout)
    theirs = _create_workspace_only(layout, OTHER_WS)

    outcome = release_resources(layout, _facts(owned=True, live_elsewhere=True))

    assert outcome == ReleaseOutcome(released=("workspace",), kept=("session", "agent_lease"))
    assert _exists(layout) == {
        "sidecar": True,
        "attachments": True,
        "workspace": False,
        "agent_lease": True,
    }
    assert theirs.exists()  # the other workspace's scratch directory is its own


def _create_workspace_only(layout: ResourceLayout, ws: str) -> Path:
    path = layout.workspace_dir(ws, SID) / "scratch.json"
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    return path


def test_several_workspace_rows_for_one_id_are_released_idempotently(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    _create(layout, WS)
    theirs = _create_workspace_only(layout, OTHER_WS)
    neighbour = _create(layout, WS, "s-2")

    first = release_resources(layout, _facts(ws=WS))
    second = release_resources(layout, _facts(ws=OTHER_WS))  # the same id's other row
    again = release_resources(layout, _facts(ws=WS))  # a retry of the first row

    assert first == second == again == ReleaseOutcome(released=ALL, kept=())
    assert not theirs.exists()
    assert not any(_exists(layout).values())
    assert all(path.exists() for path in neighbour.values())  # another Session is untouched


def test_a_release_without_a_resource_root_succeeds(tmp_path: Path) -> None:
    layout = ResourceLayout(tmp_path / "never-created")
    assert release_resources(layout, _facts()) == ReleaseOutcome(released=ALL, kept=())
    assert not layout.root.exists()


def test_a_symlink_at_a_resource_path_is_unlinked_and_its_target_survives(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path)
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "keep.txt").write_text("keep")
    layout.sidecar_dir(SID).parent.mkdir(parents=True)
    layout.sidecar_dir(SID).symlink_to(outside, target_is_directory=True)
    layout.agent_lease(SID).parent.mkdir(parents=True)
    layout.agent_lease(SID).symlink_to(outside / "precious" / "keep.txt")
    # A symlink inside a resource directory is removed as a link too (rmtree never follows).
    layout.workspace_dir(WS, SID).mkdir(parents=True)
    (layout.workspace_dir(WS, SID) / "link").symlink_to(outside, target_is_directory=True)

    outcome = release_resources(layout, _facts())

    assert outcome == ReleaseOutcome(released=ALL, kept=())
    assert not os.path.lexists(layout.sidecar_dir(SID))
    assert not os.path.lexists(layout.agent_lease(SID))
    assert not layout.workspace_dir(WS, SID).exists()
    assert (outside / "precious" / "keep.txt").read_text() == "keep"


def test_a_symlinked_parent_is_not_followed_and_the_other_classes_are_released(
    tmp_path: Path,
) -> None:
    """Works as root too: a real file-system state that fails one class."""
    layout = _layout(tmp_path)
    outside = tmp_path / "outside"
    (outside / "sidecar").mkdir(parents=True)
    (outside / "sidecar" / "state.json").write_text("keep")
    (layout.root / "sessions").mkdir(parents=True)
    (layout.root / "sessions" / SID).symlink_to(outside, target_is_directory=True)
    _create_workspace_only(layout, WS)
    layout.agent_lease(SID).mkdir(parents=True)

    with pytest.raises(ResourceReleaseError) as raised:
        release_resources(layout, _facts())

    error = raised.value
    assert error.failed == ("session",)
    assert error.outcome == ReleaseOutcome(released=("workspace", "agent_lease"), kept=())
    expected = f"could not release session: sessions/{SID} is a symbolic link, not followed"
    assert str(error) == expected
    assert str(tmp_path) not in str(error)
    assert (outside / "sidecar" / "state.json").read_text() == "keep"
    assert not layout.workspace_dir(WS, SID).exists()
    assert not layout.agent_lease(SID).exists()


def test_a_worktree_elsewhere_under_the_data_dir_survives_every_release(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    data_dir = layout.root.parent
    worktree = data_dir / "worktrees" / WS / SID
    worktree.mkdir(parents=True)
    (worktree / "main.py").write_text("print('mine')")
    _create(layout)
    # Even a worktree linked from inside a resource directory is not followed.
    (layout.workspace_dir(WS, SID) / "worktree").symlink_to(worktree, target_is_directory=True)

    release_resources(layout, _facts())
    release_resources(layout, _facts(ws=OTHER_WS))

    assert (worktree / "main.py").read_text() == "print('mine')"


def test_a_file_where_a_resource_directory_would_be_is_removed(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    layout.agent_lease(SID).parent.mkdir(parents=True)
    layout.agent_lease(SID).write_text("stray")
    (layout.root / "workspaces").mkdir()
    (layout.root / "workspaces" / WS).write_text("a file where a directory would be")

    assert release_resources(layout, _facts()) == ReleaseOutcome(released=ALL, kept=())
    assert not layout.agent_lease(SID).exists()
    assert (layout.root / "workspaces" / WS).is_file()  # not a resource: left alone


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_permission_failure_raises_after_the_other_classes_are_released(
    tmp_path: Path,
) -> None:
    layout = _layout(tmp_path)
    _create(layout)
    locked = layout.workspace_dir(WS, SID).parent  # workspaces/<ws>/sessions
    locked.chmod(0o500)
    try:
        with pytest.raises(ResourceReleaseError) as raised:
            release_resources(layout, _facts())
    finally:
        locked.chmod(0o700)

    error = raised.value
    assert error.failed == ("workspace",)
    assert error.outcome == ReleaseOutcome(released=("session", "agent_lease"), kept=())
    assert f"workspace: workspaces/{WS}/sessions/{SID}: EACCES" in str(error)
    assert str(tmp_path) not in str(error)
    assert layout.workspace_dir(WS, SID).exists()
    assert not layout.sidecar_dir(SID).exists()
    assert not layout.agent_lease(SID).exists()
    # The next attempt, once the cause is gone, releases what is left.
    assert release_resources(layout, _facts()) == ReleaseOutcome(released=ALL, kept=())
    assert not layout.workspace_dir(WS, SID).exists()


def test_an_os_error_is_raised_sanitized_after_the_other_classes_are_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Works as root: an injected ``EACCES`` from the tree removal of the sidecar."""
    layout = _layout(tmp_path)
    _create(layout)
    real_rmtree = shutil.rmtree

    def failing_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if path == "sidecar":
            raise PermissionError(13, "Permission denied", str(layout.sidecar_dir(SID)))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", failing_rmtree)
    with pytest.raises(ResourceReleaseError) as raised:
        release_resources(layout, _facts())
    monkeypatch.undo()

    error = raised.value
    assert str(error) == (
        f"could not release session: sessions/{SID}/sidecar: EACCES (Permission denied)"
    )
    assert str(tmp_path) not in str(error)
    assert error.failed == ("session",)
    assert error.outcome == ReleaseOutcome(released=("workspace", "agent_lease"), kept=())
    assert layout.sidecar_dir(SID).exists()
    assert not layout.workspace_dir(WS, SID).exists()
    assert not layout.agent_lease(SID).exists()
    assert release_resources(layout, _facts()) == ReleaseOutcome(released=ALL, kept=())
    assert not layout.sidecar_dir(SID).exists()
