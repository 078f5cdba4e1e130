"""The Subscriber's persisted device state and its stores (LIVE-SUB-1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.livestream.subscriber import (
    Attachment,
    Cursor,
    DesiredAttachment,
    DeviceState,
    FileStateStore,
    MemoryStateStore,
    StateCorruptError,
)


def full_state() -> DeviceState:
    return DeviceState(
        device_id="phone-1",
        workspace_ids=("ws-a", "ws-b"),
        cursor=Cursor("e-7", 2**53 - 1),
        revisions={"b1": 3, "b2": 1},
        desired={
            "b1": DesiredAttachment("ws-a", "s-1", "t-9"),
            "b2": DesiredAttachment("ws-b", "s-2"),
        },
        attachments={
            "b1": Attachment(
                revision=3,
                workspace_id="ws-a",
                session_id="s-1",
                caller_turn_id="t-9",
                caught_up=True,
                snapshot_seen=True,
                snapshot_root_turn_id="t-1",
                canonical_turn_ids=frozenset({"t-1", "t-2"}),
                current_root_turn_id="t-1",
            ),
            "b2": Attachment(
                revision=1,
                workspace_id="ws-b",
                session_id="s-2",
                snapshot_seen=True,
                rejected_reason="HOST_UNAVAILABLE",
            ),
        },
    )


@pytest.mark.spec("LIVE-SUB-1")
def test_cursor_projection_and_revisions_round_trip_as_one_document() -> None:
    state = full_state()
    text = state.to_json()
    document = json.loads(text)
    assert document["format"] == 1
    assert document["cursor"] == {"epoch": "e-7", "last_sequence": 2**53 - 1}
    assert set(document) == {
        "format",
        "device_id",
        "workspace_ids",
        "cursor",
        "revisions",
        "desired",
        "attachments",
    }
    assert DeviceState.from_json(text) == state


@pytest.mark.spec("LIVE-SUB-1")
def test_a_not_caught_up_binding_survives_the_round_trip() -> None:
    state = DeviceState(
        device_id="d",
        workspace_ids=("ws-a",),
        cursor=Cursor("e", 4),
        attachments={
            "b": Attachment(
                revision=2,
                workspace_id="ws-a",
                session_id="s",
                snapshot_seen=True,
                snapshot_root_turn_id=None,
            )
        },
    )
    restored = DeviceState.from_json(state.to_json())
    assert restored.attachments["b"].caught_up is False
    assert restored.attachments["b"].snapshot_seen is True
    assert restored.attachments["b"].snapshot_root_turn_id is None


def test_copy_is_independent() -> None:
    state = full_state()
    twin = state.copy()
    twin.revisions["b1"] = 99
    twin.attachments["b1"].caught_up = False
    assert state.revisions["b1"] == 3
    assert state.attachments["b1"].caught_up


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        json.dumps({"format": 2}),
        json.dumps({"format": 1}),
        full_state().to_json().replace('"last_sequence":9007199254740991', '"last_sequence":-1'),
        full_state().to_json().replace('"b1":3', '"b1":true'),
        full_state().to_json().replace('"caught_up":true', '"caught_up":1'),
        full_state().to_json().replace('"device_id":"phone-1"', '"device_id":7'),
    ],
    ids=[
        "not-json",
        "not-object",
        "other-format",
        "missing-fields",
        "cursor-negative",
        "bool-revision",
        "int-flag",
        "number-id",
    ],
)
def test_an_unreadable_document_is_refused_not_guessed(text: str) -> None:
    with pytest.raises(StateCorruptError):
        DeviceState.from_json(text)


@pytest.mark.spec("LIVE-SUB-1")
def test_the_memory_store_keeps_the_json_text() -> None:
    store = MemoryStateStore()
    assert store.load() is None
    state = full_state()
    store.save(state)
    state.revisions["b1"] = 50  # later mutation does not leak into the saved document
    loaded = store.load()
    assert loaded == full_state()
    assert store.saves == 1
    assert store.text is not None


@pytest.mark.spec("LIVE-SUB-1")
def test_the_file_store_round_trips_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "device.json"
    store = FileStateStore(path)
    assert store.load() is None
    store.save(full_state())
    second = full_state()
    second.cursor = Cursor("e-8", 1)
    store.save(second)
    assert FileStateStore(path).load() == second
    assert sorted(p.name for p in path.parent.iterdir()) == ["device.json"]


@pytest.mark.spec("LIVE-SUB-1")
def test_the_file_store_fsyncs_the_data_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append("fsync")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        steps.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    FileStateStore(tmp_path / "s.json").save(full_state())
    # The file's data first, then the rename, then the directory (so the rename persists).
    assert steps == ["fsync", "replace", "fsync"]


@pytest.mark.spec("LIVE-SUB-1")
def test_a_failed_save_keeps_the_previous_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.json"
    store = FileStateStore(path)
    store.save(full_state())
    before = path.read_text(encoding="utf-8")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    changed = full_state()
    changed.cursor = Cursor("e-9", 5)
    with pytest.raises(OSError, match="No space"):
        store.save(changed)
    assert path.read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_a_corrupt_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(StateCorruptError):
        FileStateStore(path).load()
    path.write_text('{"format": 1, "cursor": null}', encoding="utf-8")
    with pytest.raises(StateCorruptError):
        FileStateStore(path).load()
