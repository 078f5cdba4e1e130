"""The local workspace file index and the exact catalog decoder of the ``@`` menu (HOST-MENT-4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from domainerrors import Unavailable
from services.host.model.records import Subagent, decode_subagent_catalog
from services.host.turns.workspace_index import local_workspace_index


@pytest.mark.spec("HOST-MENT-1", "HOST-MENT-4")
def test_the_local_index_answers_root_entries_and_fails_loudly(tmp_path: Path) -> None:
    (tmp_path / "reviewer").mkdir()
    (tmp_path / "notes").write_text("x")
    index = local_workspace_index(str(tmp_path))
    assert index("reviewer")
    assert index("notes")
    assert not index("explorer")
    # Names that cannot be one root entry are never entries (and never touch the disk).
    for name in ("", ".", "..", "reviewer/x", "a\\b"):
        assert not index(name)
    # A root that does not exist holds no entries; no root known: no entries.
    assert not local_workspace_index(str(tmp_path / "missing"))("explorer")
    assert not local_workspace_index(None)("explorer")
    # A root that cannot be searched is a failed read, never "no such entry".
    unreadable = local_workspace_index(str(tmp_path / ("x" * 300)))
    with pytest.raises(Unavailable) as caught:
        unreadable("explorer")
    assert caught.value.reason == "WORKSPACE_INDEX_UNAVAILABLE"
    assert caught.value.retry_after_seconds is not None


@pytest.mark.spec("HOST-MENT-4")
def test_a_stored_catalog_is_decoded_whole_or_not_at_all() -> None:
    assert decode_subagent_catalog(None) == ()
    assert decode_subagent_catalog("") == ()
    assert decode_subagent_catalog("[]") == ()
    assert decode_subagent_catalog(
        '[{"name": "explorer", "description": "Reads"}, {"name": "reviewer"}]'
    ) == (Subagent("explorer", "Reads"), Subagent("reviewer", ""))
    for unreadable in (
        "{",
        '{"name": "explorer"}',
        "null",
        '["explorer"]',
        '[{"name": "explorer"}, {"title": "no name"}]',
        '[{"name": 7}]',
        '[{"name": "explorer", "description": 1}]',
    ):
        assert decode_subagent_catalog(unreadable) is None, unreadable
