"""The retention purge's component fence, batch fallback and volume accounting (HOST-DEL-9).

The purge classifies candidates from per-component aggregates and removes whole components with
one fenced ``DELETE`` per batch. These tests change trees *between* the scan and the delete —
the races the fence exists for — and check that a changed tree is kept whole while the other
trees of the same batch are still removed. Every test runs on SQLite and Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, func, select, update

from services.host.context import HostContext
from services.host.deletion import delete as deletion
from services.host.deletion import purge, restore
from services.host.deletion.delete import Forest
from services.host.repository.unit_of_work import HostTransaction
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.legacy_tombstones import mark_legacy_tombstones
from store.models import Message, Session
from tests.support.session_trees import (
    add_active_turn,
    add_messages,
    add_tree,
    cleanup_rows,
    sessions,
)

T = TypeVar("T")
WS = "ws-1"
CUTOFF = 10**7


class Purger:
    """Domain calls on a private event loop with a ticking clock."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.database = Database(url)
        self.loop.run_until_complete(self.database.start())
        self.ctx = HostContext(database=self.database, command_codec=ProtoCommandCodec())
        clock = iter(range(1_000, 10**6, 1_000))
        self.ctx.clock = lambda: next(clock)

    def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def delete(self, *ids: str, workspace_id: str = WS) -> None:
        self.run(deletion.delete_sessions(self.ctx, workspace_id, list(ids)))

    def scan(self, cutoff: int = CUTOFF) -> dict[str, purge.ScanItem]:
        items = self.run(purge.scan_trees(self.ctx, WS, cutoff))
        return {item.candidate.session_id: item for item in items}

    def selections(self, *topmosts: str) -> list[purge.TreeSelection]:
        scanned = self.scan()
        chosen = [scanned[t].selection for t in topmosts]
        assert all(s is not None for s in chosen), scanned
        return [s for s in chosen if s is not None]

    def close(self) -> None:
        self.run(self.database.stop())
        self.loop.close()


@pytest.fixture
def engine(sync_engine: Engine) -> Engine:
    """The test database's sync engine, under the short name these tests use."""
    return sync_engine


@pytest.fixture
def purger(migrated_db_url: str) -> Iterator[Purger]:
    created = Purger(migrated_db_url)
    yield created
    created.close()


def _two_trees(engine: Engine, purger: Purger) -> list[purge.TreeSelection]:
    add_tree(engine, {"a": None, "a1": "a", "a2": "a1", "b": None, "b1": "b"})
    purger.delete("a", "b")
    return purger.selections("a", "b")


@pytest.mark.spec("HOST-DEL-9")
def test_a_tree_restored_and_deleted_again_is_kept_while_the_rest_of_its_batch_goes(
    engine: Engine, purger: Purger
) -> None:
    batch = _two_trees(engine, purger)
    purger.run(restore.restore_deleted_session(purger.ctx, WS, "a"))
    purger.delete("a")  # a fresh generation and deleted_at: the scan's fence no longer holds
    removed = purger.run(purge.purge_trees(purger.ctx, batch))
    assert {top: sorted(ids) for top, ids in removed.items()} == {"b": ["b", "b1"]}
    assert set(sessions(engine)) == {"a", "a1", "a2"}
    assert cleanup_rows(engine) == {(WS, "b"), (WS, "b1")}


@pytest.mark.spec("HOST-DEL-9")
def test_the_fence_is_the_exact_deleted_at_not_only_the_generation(
    engine: Engine, purger: Purger
) -> None:
    batch = _two_trees(engine, purger)
    with engine.begin() as connection:  # same generation, another deleted_at
        connection.execute(
            update(Session)
            .where(Session.session_id.in_(["a", "a1", "a2"]))
            .values(deleted_at_unix_ms=Session.deleted_at_unix_ms + 1)
        )
    removed = purger.run(purge.purge_trees(purger.ctx, batch))
    assert set(removed) == {"b"}
    assert set(sessions(engine)) == {"a", "a1", "a2"}


@pytest.mark.spec("HOST-DEL-9")
def test_a_member_that_gained_a_child_outside_the_component_keeps_its_tree_whole(
    engine: Engine, purger: Purger
) -> None:
    batch = _two_trees(engine, purger)
    add_tree(engine, {"late": "a2"})  # written past the host's rules, as a racing writer would
    removed = purger.run(purge.purge_trees(purger.ctx, batch))
    assert set(removed) == {"b"}
    assert set(sessions(engine)) == {"a", "a1", "a2", "late"}
    assert cleanup_rows(engine) == {(WS, "b"), (WS, "b1")}


@pytest.mark.spec("HOST-DEL-9")
def test_a_child_topmost_whose_parent_was_tombstoned_is_no_longer_purged_as_a_tree(
    engine: Engine, purger: Purger
) -> None:
    add_tree(engine, {"r": None, "c": "r", "c1": "c", "o": None})
    purger.delete("c", "o")
    batch = purger.selections("c", "o")
    mark_legacy_tombstones(engine, WS, ["r"], 500)  # "c" is now inside r's tree
    removed = purger.run(purge.purge_trees(purger.ctx, batch))
    assert set(removed) == {"o"}
    assert set(sessions(engine)) == {"r", "c", "c1"}


@pytest.mark.spec("HOST-DEL-8", "HOST-DEL-9")
def test_the_scan_classifies_every_shape_of_tree_like_its_rows_do(
    engine: Engine, purger: Purger
) -> None:
    add_tree(
        engine,
        {
            "clean": None,
            "clean1": "clean",
            "clean2": "clean",
            "live": None,
            "live1": "live",
            "legacy": None,
            "legacy1": "legacy",
            "young": None,
            "young1": "young",
            "odd": None,
            "odd1": "odd",
            "child_top_parent": None,
            "child_top": "child_top_parent",
            "child_top1": "child_top",
        },
    )
    purger.delete("clean", "live", "legacy", "young", "odd", "child_top")
    with engine.begin() as connection:
        # a live descendant under a tombstone: blocked
        connection.execute(
            update(Session)
            .where(Session.session_id == "live1")
            .values(deleted_at_unix_ms=None, deletion_generation=None, component_size=None)
        )
        # a member deleted after the cutoff (another generation): blocked
        connection.execute(
            update(Session)
            .where(Session.session_id == "young1")
            .values(deleted_at_unix_ms=CUTOFF + 1, deletion_generation="gen-young")
        )
        # a component size that disagrees with the tree: not restorable, skipped
        connection.execute(
            update(Session).where(Session.session_id == "odd1").values(component_size=5)
        )
    mark_legacy_tombstones(engine, WS, ["legacy1"], 500)
    scanned = purger.scan()
    verdicts = {
        sid: "eligible" if item.selection else "blocked" if item.blocked else "skipped"
        for sid, item in scanned.items()
    }
    assert verdicts == {
        "clean": "eligible",
        "child_top": "eligible",
        "live": "blocked",
        "young": "blocked",
        "legacy": "skipped",
        "odd": "skipped",
    }

    async def rows(scope: HostTransaction) -> Forest:
        roots = {item.candidate.root_session_id for item in scanned.values()}
        return Forest(await scope.deletion.tree_rows(WS, roots))

    forest = purger.run(purger.ctx.transact(rows, write=False))
    for sid, verdict in verdicts.items():
        assert (verdict != "skipped" and verdict != "blocked") == (
            forest.verdict(sid).restorable
            and all(not forest.rows[m].is_live for m in forest.subtree(sid))
            and all((forest.rows[m].deleted_at_unix_ms or 0) <= CUTOFF for m in forest.subtree(sid))
        ), sid


@pytest.mark.spec("HOST-DEL-9")
def test_purged_rows_and_bytes_count_what_was_removed(engine: Engine, purger: Purger) -> None:
    add_tree(engine, {"r": None, "r1": "r", "s": None})
    add_messages(engine, ["r", "r1"], 3, payload='{"text":"héllo"}')  # é is two UTF-8 bytes
    add_messages(engine, ["s"], 2)
    add_active_turn(engine, "r1", "t1", pending_interactions=2)
    purger.delete("r", "s")
    with engine.connect() as connection:
        payload_bytes = sum(
            len(str(p).encode()) for p in connection.execute(select(Message.payload_json)).scalars()
        )
    report = purger.run(
        purge.purge_deleted_sessions(
            purger.ctx, WS, CUTOFF, purge.PurgeBounds(max_trees=10, max_rows=10**6)
        )
    )
    # 3 Sessions, 8 Messages, 1 Turn, 2 Interactions
    assert (report.purged_tree_count, report.purged_row_count) == (2, 14)
    assert report.purged_bytes == payload_bytes
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(Message)).scalar_one() == 0
    assert sessions(engine) == {}


@pytest.mark.spec("HOST-DEL-9")
def test_a_dry_run_reports_the_members_and_changes_nothing(engine: Engine, purger: Purger) -> None:
    _two_trees(engine, purger)
    report = purger.run(
        purge.purge_deleted_sessions(purger.ctx, WS, CUTOFF, purge.PurgeBounds(), dry_run=True)
    )
    assert sorted(sid for _, sid in report.purged) == ["a", "a1", "a2", "b", "b1"]
    assert report.purged_tree_count == 2
    assert len(sessions(engine)) == 5
    assert cleanup_rows(engine) == set()


@pytest.mark.spec("HOST-DEL-9")
def test_one_call_purges_the_same_ids_in_several_workspaces(engine: Engine, purger: Purger) -> None:
    for workspace in ("ws-1", "ws-2"):
        add_tree(engine, {"x": None, "x1": "x"}, workspace_id=workspace)
        purger.delete("x", workspace_id=workspace)
    report = purger.run(purge.purge_deleted_sessions(purger.ctx, None, CUTOFF, purge.PurgeBounds()))
    assert (report.purged_tree_count, report.blocked_tree_count) == (2, 0)
    assert sorted(report.purged) == [("ws-1", "x"), ("ws-1", "x1"), ("ws-2", "x"), ("ws-2", "x1")]
    assert cleanup_rows(engine) == set(report.purged)


@pytest.mark.spec("HOST-DEL-9")
def test_a_purge_over_several_scan_pages_takes_trees_in_order_up_to_the_bound(
    engine: Engine, purger: Purger
) -> None:
    count = purge.FIRST_SCAN_BATCH + 60
    ids = [f"t{i:04d}" for i in range(count)]
    add_tree(engine, dict.fromkeys(ids) | {f"{sid}-kid": sid for sid in ids[::7]})
    purger.delete(*ids)  # one deleted_at: the scan goes in id order
    with engine.begin() as connection:  # every 7th tree has a live child: blocked
        connection.execute(
            update(Session)
            .where(Session.session_id.in_([f"{sid}-kid" for sid in ids[::7]]))
            .values(deleted_at_unix_ms=None, deletion_generation=None, component_size=None)
        )
    eligible = [sid for index, sid in enumerate(ids) if index % 7]
    bound = purge.FIRST_SCAN_BATCH + 10
    first = purger.run(
        purge.purge_deleted_sessions(
            purger.ctx, WS, CUTOFF, purge.PurgeBounds(max_trees=bound, max_rows=10**6)
        )
    )
    assert [sid for _, sid in first.purged] == eligible[:bound]
    assert first.more_remaining
    stop = ids.index(eligible[bound])  # the scan stopped at the first tree over the bound
    assert first.blocked_tree_count == len(ids[:stop:7])
    second = purger.run(
        purge.purge_deleted_sessions(
            purger.ctx, WS, CUTOFF, purge.PurgeBounds(max_trees=bound, max_rows=10**6)
        )
    )
    assert [sid for _, sid in second.purged] == eligible[bound:]
    assert not second.more_remaining
    assert second.blocked_tree_count == len(ids[::7])
    assert set(sessions(engine)) == set(ids[::7]) | {f"{s}-kid" for s in ids[::7]}


@pytest.mark.spec("HOST-DEL-9")
def test_a_purge_call_slices_its_write_transactions_by_backend(
    engine: Engine, purger: Purger, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite closes a write transaction at 1,000 rows (one writer); Postgres takes a call whole.

    30 trees of 2 Sessions with 20 messages each (42 rows per tree, 1,260 in all) in one call at
    maintenance's bounds: SQLite needs two write transactions, Postgres one; every tree whole.
    """
    roots = [f"t{i:02d}" for i in range(30)]
    add_tree(engine, dict.fromkeys(roots) | {f"{root}-kid": root for root in roots})
    add_messages(engine, [*roots, *(f"{root}-kid" for root in roots)], 20)
    purger.delete(*roots)
    batches: list[list[str]] = []
    real_purge_trees = purge.purge_trees

    async def counted(
        ctx: HostContext, selections: list[purge.TreeSelection], **kwargs: Any
    ) -> dict[str, list[str]]:
        batches.append([s.topmost for s in selections])
        return await real_purge_trees(ctx, selections, **kwargs)

    monkeypatch.setattr(purge, "purge_trees", counted)
    report = purger.run(
        purge.purge_deleted_sessions(
            purger.ctx, WS, CUTOFF, purge.PurgeBounds(max_trees=100, max_rows=10_000)
        )
    )
    assert (report.purged_tree_count, report.purged_row_count) == (30, 1_260)
    expected = {"sqlite": [23, 7], "postgres": [30]}[backend]  # 23 x 42 = 966 <= 1,000
    assert [len(batch) for batch in batches] == expected
    assert sessions(engine) == {}
    assert cleanup_rows(engine) == set(report.purged)
    assert purge.slice_rows(purger.database.url) == (
        purge.ROWS_PER_TRANSACTION if backend == "sqlite" else purge.POSTGRES_ROWS_PER_TRANSACTION
    )
