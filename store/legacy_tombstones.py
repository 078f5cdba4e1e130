"""Legacy (lossy) tombstones: what the older delete implementation left behind (HOST-DEL-8).

The older implementation tombstoned Sessions without a generation or component size. Such
rows stay visible to ``ListDeletedSessions`` and removable by ``PurgeWorkspaceTombstones``,
but are never restorable and never upgraded by a later delete (HOST-DEL-5). Data migrations
import them with :func:`mark_legacy_tombstones` (also ``tutti admin mark-legacy-tombstones``);
tests use it to build legacy trees.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, update

from store.models import Session, Turn

__all__ = ["mark_legacy_tombstones"]

_CHUNK = 500


def mark_legacy_tombstones(
    engine: Engine, workspace_id: str, session_ids: Sequence[str], deleted_at_unix_ms: int
) -> int:
    """Mark exactly these Sessions as legacy tombstones, in one transaction.

    The lossy shape: ``deleted_at`` set, no generation, no component size,
    ``tombstone_legacy``. Active Turns are settled ``interrupted`` (a tombstone has no active
    Turn); ``updated_at`` and placement are left alone. Descendants are not included: name
    every Session to mark.

    Returns:
        How many Sessions were marked (ids not in the workspace are ignored).
    """
    ids = sorted(set(session_ids))
    marked = 0
    with engine.begin() as connection:
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            connection.execute(
                update(Turn)
                .where(
                    Turn.workspace_id == workspace_id,
                    Turn.session_id.in_(chunk),
                    Turn.phase != "settled",
                )
                .values(
                    phase="settled",
                    outcome="interrupted",
                    settled_at_unix_ms=deleted_at_unix_ms,
                    version=Turn.version + 1,
                    deferred_settlement_json=None,
                )
            )
            result = connection.execute(
                update(Session)
                .where(Session.workspace_id == workspace_id, Session.session_id.in_(chunk))
                .values(
                    deleted_at_unix_ms=deleted_at_unix_ms,
                    deletion_generation=None,
                    component_size=None,
                    tombstone_legacy=True,
                    active_turn_id=None,
                )
            )
            marked += int(result.rowcount)
    return marked
