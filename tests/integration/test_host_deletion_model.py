"""A stateful model of delete, restore and purge over random forests (HOST-DEL-1..10).

Hypothesis grows random Session forests (roots and children of live Sessions), and applies
random batch deletes, restores, retention purges, manual workspace purges and legacy
tombstones through the domain on both backends. After every step the store must equal a
small reference model written independently of ``services.host.deletion.delete``: which Sessions
exist, which are tombstoned, and for tombstones the ``deleted_at``, legacy flag, component
size and the partition of tombstones into generations.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from domainerrors import FailedPrecondition
from services.host.context import HostContext
from services.host.deletion import delete as deletion
from services.host.deletion import purge, restore
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.engine import create_sync_engine_for
from store.legacy_tombstones import mark_legacy_tombstones
from tests.support.session_trees import add_tree, sessions

T = TypeVar("T")


@dataclass
class Node:
    """The reference model of one Session."""

    parent: str | None
    deleted_at: int | None = None
    generation: int | None = None
    size: int | None = None
    legacy: bool = False


class Model:
    """The HOST-DEL rules, restated as plainly as possible."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.generations = itertools.count(1)

    def subtree(self, sid: str) -> list[str]:
        found = [sid]
        for member in found:
            found.extend(c for c, n in self.nodes.items() if n.parent == member)
        return found

    def live(self, sid: str) -> bool:
        return self.nodes[sid].deleted_at is None

    def topmost(self, sid: str) -> bool:
        parent = self.nodes[sid].parent
        return not self.live(sid) and (parent is None or self.live(parent))

    def restorable(self, sid: str) -> bool:
        tree = [self.nodes[m] for m in self.subtree(sid)]
        return (
            not any(n.legacy or n.deleted_at is None for n in tree)
            and len({(n.deleted_at, n.generation) for n in tree}) == 1
            and all(n.size == len(tree) for n in tree)
        )

    def delete(self, requested: list[str], now: int) -> None:
        closure = {m for r in requested for m in self.subtree(r)}
        newly = {m for m in closure if self.live(m)}
        absorbed: set[str] = set()
        for m in closure:
            if not self.live(m) and self.nodes[m].parent in newly and self.restorable(m):
                absorbed |= set(self.subtree(m))
        members = newly | absorbed
        while members:
            seed = members.pop()
            component = {seed}
            changed = True
            while changed:  # connectivity through parent edges inside the delete set
                grown = {
                    m
                    for m in members
                    if self.nodes[m].parent in component
                    or any(self.nodes[c].parent == m for c in component)
                }
                changed = bool(grown)
                component |= grown
                members -= grown
            generation = next(self.generations)
            for m in component:
                self.nodes[m] = Node(self.nodes[m].parent, now, generation, len(component))

    def restore(self, sid: str) -> None:
        for m in self.subtree(sid):
            self.nodes[m] = Node(self.nodes[m].parent)

    def remove(self, ids: list[str]) -> None:
        for m in ids:
            del self.nodes[m]


def _machine(url: str) -> type[RuleBasedStateMachine]:
    class DeletionModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.database = Database(url)
            self.loop.run_until_complete(self.database.start())
            self.ctx = HostContext(database=self.database, command_codec=ProtoCommandCodec())
            self.ticks = itertools.count(1_000, 1_000)
            self.last = 0
            self.ctx.clock = self.tick
            self.engine = create_sync_engine_for(url)
            self.model = Model()
            self.names = (f"s{i}" for i in itertools.count())
            # A fresh workspace per example: id(self) can repeat once an old machine is freed.
            self.workspace = f"ws-{uuid.uuid4().hex[:12]}"

        def tick(self) -> int:
            """The fake clock; remembers the value the last command saw."""
            self.last = next(self.ticks)
            return self.last

        def teardown(self) -> None:
            self.engine.dispose()
            self.loop.run_until_complete(self.database.stop())
            self.loop.close()

        def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
            return self.loop.run_until_complete(awaitable)

        def existing(self, data: st.DataObject, *, live: bool | None = None) -> str | None:
            pool = sorted(
                sid for sid in self.model.nodes if live is None or self.model.live(sid) == live
            )
            return data.draw(st.sampled_from(pool)) if pool else None

        @rule()
        def create_root(self) -> None:
            sid = next(self.names)
            add_tree(self.engine, {sid: None}, workspace_id=self.workspace)
            self.model.nodes[sid] = Node(None)

        @rule(data=st.data())
        def create_child(self, data: st.DataObject) -> None:
            parent = self.existing(data, live=True)
            if parent is None:
                return
            sid = next(self.names)
            add_tree(self.engine, {sid: parent}, workspace_id=self.workspace)
            self.model.nodes[sid] = Node(parent)

        @rule(data=st.data())
        def delete(self, data: st.DataObject) -> None:
            pool = sorted(self.model.nodes)
            if not pool:
                return
            requested = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
            requested = list(dict.fromkeys(requested))
            self.run(deletion.delete_sessions(self.ctx, self.workspace, requested))
            self.model.delete(requested, self.last)

        @rule(data=st.data())
        def restore(self, data: st.DataObject) -> None:
            tops = sorted(s for s in self.model.nodes if self.model.topmost(s))
            if not tops:
                return
            sid = data.draw(st.sampled_from(tops))
            if self.model.restorable(sid):
                self.run(restore.restore_deleted_session(self.ctx, self.workspace, sid))
                self.model.restore(sid)
            else:
                with pytest.raises(FailedPrecondition) as caught:
                    self.run(restore.restore_deleted_session(self.ctx, self.workspace, sid))
                assert caught.value.reason == "COMPONENT_NOT_RESTORABLE"

        @rule(data=st.data())
        def legacy(self, data: st.DataObject) -> None:
            # The older lossy implementation tombstoned single leaves without a generation.
            leaves = sorted(
                s
                for s in self.model.nodes
                if self.model.live(s)
                and not any(
                    n.parent == s and n.deleted_at is None for n in self.model.nodes.values()
                )
            )
            if not leaves:
                return
            sid = data.draw(st.sampled_from(leaves))
            now = self.tick()
            mark_legacy_tombstones(self.engine, self.workspace, [sid], now)
            self.model.nodes[sid] = Node(self.model.nodes[sid].parent, now, None, None, True)

        @rule(cutoff_back=st.integers(min_value=0, max_value=5))
        def purge(self, cutoff_back: int) -> None:
            cutoff = self.last - cutoff_back * 1_000
            expected: list[str] = []
            for sid in sorted(self.model.nodes):
                if not self.model.topmost(sid) or (self.model.nodes[sid].deleted_at or 0) > cutoff:
                    continue
                tree = self.model.subtree(sid)
                nodes = [self.model.nodes[m] for m in tree]
                if any(n.deleted_at is None or n.deleted_at > cutoff for n in nodes):
                    continue  # blocked
                if self.model.restorable(sid):
                    expected.extend(tree)
            report = self.run(
                purge.purge_deleted_sessions(
                    self.ctx, self.workspace, cutoff, purge.PurgeBounds(max_trees=1000)
                )
            )
            assert sorted(sid for _, sid in report.purged) == sorted(expected)
            self.model.remove(expected)

        @rule()
        def purge_workspace(self) -> None:
            expected: list[str] = []
            for sid in sorted(self.model.nodes):
                if self.model.topmost(sid):
                    tree = self.model.subtree(sid)
                    if all(not self.model.live(m) for m in tree):
                        expected.extend(tree)
            report = self.run(
                purge.purge_workspace_tombstones(self.ctx, self.workspace, None, 1000)
            )
            assert sorted(report.purged_session_ids) == sorted(expected)
            self.model.remove(expected)

        @invariant()
        def store_equals_model(self) -> None:
            rows = sessions(self.engine, self.workspace)
            assert set(rows) == set(self.model.nodes)
            gen_map: dict[int, str | None] = {}
            for sid, node in self.model.nodes.items():
                row = rows[sid]
                assert row.parent_session_id == node.parent
                assert row.deleted_at_unix_ms == node.deleted_at, sid
                assert row.tombstone_legacy == node.legacy
                assert row.component_size == node.size
                if node.generation is not None:
                    assert gen_map.setdefault(node.generation, row.deletion_generation) == (
                        row.deletion_generation
                    )
                else:
                    assert row.deletion_generation is None
            assert len(set(gen_map.values())) == len(gen_map)

    return DeletionModel


@pytest.mark.spec(
    "HOST-DEL-1",
    "HOST-DEL-3",
    "HOST-DEL-4",
    "HOST-DEL-5",
    "HOST-DEL-8",
    "HOST-DEL-9",
    "HOST-DEL-10",
)
def test_random_forests_follow_the_reference_model(migrated_db_url: str) -> None:
    run_state_machine_as_test(_machine(migrated_db_url))
