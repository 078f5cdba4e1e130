"""Random lifecycles never let a runtime report change a tombstone or revive a fenced id.

A stateful Hypothesis test drives one Host over a real socket, on SQLite and Postgres: it
creates root Sessions, reports random items (title patches, queued, running and settled
Turns, messages, child creation under a random parent) for a small pool of ids through a
scripted runtime, deletes, restores, purges and completes cleanups. Before and after
every report it reads the store itself and checks

* a report about a tombstone is ``REJECTED`` ``SESSION_DELETED``, one about a missing id
  that a pending cleanup fences is ``REJECTED`` ``SESSION_PURGED`` (HOST-DEL-3/-11);
* no report changes any stored row of any tombstone of the workspace, byte for byte;
* no fenced id comes back, by report or by ``CreateSession``;
* the link never ends.

Budget: the ``ci`` profile's examples divided by :data:`EXAMPLE_DIVISOR`, derandomized (a
fixed seed, so CI runs the same cases); ``TUTTI_HYPOTHESIS_PROFILE=soak`` runs more.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, select

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import host_pb2, host_pb2_grpc, runtime_pb2
from services.host.runtime import link
from store.engine import create_sync_engine_for
from store.models import ResourceCleanupOutbox, Session
from tests.integration.host_activity import TARGET_ID, start_host
from tests.support.runtime_client import ScriptedRuntime, turn_patch
from tests.support.servers import LiveServer, auth_metadata
from tests.support.store_snapshot import snapshot

ADMIN = auth_metadata("admin")
POOL = 6
"""Session ids per example: few, so ids are deleted, purged and reused often."""
EXAMPLE_DIVISOR = 6
STEPS = 25
REJECTED = runtime_pb2.REPORT_OUTCOME_REJECTED
OUTCOMES = {
    runtime_pb2.REPORT_OUTCOME_APPLIED,
    runtime_pb2.REPORT_OUTCOME_ALREADY_APPLIED,
    REJECTED,
}

ITEM_KINDS = ("title", "queued", "running", "settled", "message", "child")


@dataclass
class Seen:
    """What the examples exercised, checked once at the end (the test must mean something)."""

    reports: int = 0
    tombstone_reports: int = 0
    fenced_reports: int = 0
    fenced_creates: int = 0


@dataclass(frozen=True)
class State:
    """The store's view of one workspace's id pool."""

    live: frozenset[str]
    tombstones: frozenset[str]
    fenced: frozenset[str]
    """Ids absent from the workspace with a pending cleanup row in any workspace."""


def read_state(engine: Engine, workspace_id: str, pool: list[str]) -> State:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Session.session_id, Session.deleted_at_unix_ms).where(
                Session.workspace_id == workspace_id
            )
        ).all()
        cleanups = set(
            connection.execute(
                select(ResourceCleanupOutbox.session_id).where(
                    ResourceCleanupOutbox.session_id.in_(pool)
                )
            ).scalars()
        )
    present = {sid for sid, _ in rows}
    return State(
        live=frozenset(sid for sid, deleted in rows if deleted is None),
        tombstones=frozenset(sid for sid, deleted in rows if deleted is not None),
        fenced=frozenset(cleanups - present),
    )


def _machine(
    host: host_pb2_grpc.HostServiceStub, runtime: ScriptedRuntime, engine: Engine, seen: Seen
) -> type[RuleBasedStateMachine]:
    counter = itertools.count()

    class TombstoneReports(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ws = f"ws-{uuid.uuid4().hex[:12]}"
            # Unique per example: cleanup rows fence ids in every workspace.
            self.pool = [f"{self.ws}-s{i}" for i in range(POOL)]

        @initialize()
        def create_pool(self) -> None:
            """Every id of the pool starts as a live root, so deletes and purges come early."""
            for index in range(POOL):
                self.create_root(index)

        def state(self) -> State:
            return read_state(engine, self.ws, self.pool)

        def call(self, method: str, request: object) -> grpc.RpcError | None:
            failure: grpc.RpcError | None = None
            try:
                getattr(host, method)(request, metadata=ADMIN, timeout=10)
            except grpc.RpcError as error:
                failure = error
            if failure is not None:
                assert failure.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
            return failure

        @rule(index=st.integers(0, POOL - 1))
        def create_root(self, index: int) -> None:
            sid = self.pool[index]
            before = self.state()
            error = self.call(
                "CreateSession",
                host_pb2.CreateSessionRequest(
                    workspace_id=self.ws, agent_target_id=TARGET_ID, session_id=sid, cwd="/w"
                ),
            )
            if sid in before.fenced:
                seen.fenced_creates += 1
                assert error is not None
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            elif sid in before.live | before.tombstones:
                # An identical retry replays; anything else names an id in use.
                assert error is None or error.code() == grpc.StatusCode.ALREADY_EXISTS, error
            else:
                assert error is None, error

        @rule(
            data=st.data(),
            kinds=st.lists(st.sampled_from(ITEM_KINDS), min_size=1, max_size=4),
            parent=st.integers(0, POOL - 1),
        )
        def report(self, data: st.DataObject, kinds: list[str], parent: int) -> None:
            before = self.state()
            # Pick the kind of target first, so tombstones and fenced ids are reported about
            # as often as live and unknown ones.
            absent = set(self.pool) - before.live - before.tombstones - before.fenced
            groups = [
                sorted(g) for g in (before.live, before.tombstones, before.fenced, absent) if g
            ]
            self._report(
                data.draw(st.sampled_from(data.draw(st.sampled_from(groups)))), kinds, parent
            )

        @rule(
            data=st.data(),
            kinds=st.lists(st.sampled_from(ITEM_KINDS), min_size=1, max_size=4),
            parent=st.integers(0, POOL - 1),
        )
        def report_frozen(self, data: st.DataObject, kinds: list[str], parent: int) -> None:
            """A report about a tombstone or a fenced id (the cases the fix is about)."""
            before = self.state()
            if not before.tombstones | before.fenced:
                if before.live:
                    self.delete_ids([data.draw(st.sampled_from(sorted(before.live)))])
                return
            if not before.fenced and data.draw(st.integers(0, 3)) == 0:
                self.purge()  # a fenced id is the rarer case: make one
                before = self.state()
            groups = [sorted(g) for g in (before.tombstones, before.fenced) if g]
            sid = data.draw(st.sampled_from(data.draw(st.sampled_from(groups))))
            self._report(sid, kinds, parent)

        def _report(self, sid: str, kinds: list[str], parent: int) -> None:
            before = self.state()
            # Events only when the report must be refused whole: others may add some.
            refused = sid in before.tombstones | before.fenced
            tombstones = snapshot(engine, self.ws, before.tombstones, events=refused)
            items = [self._item(kind, self.pool[parent]) for kind in kinds]
            result = runtime.report(self.ws, sid, f"r-{next(counter)}", *items)
            seen.reports += 1
            assert result.outcome in OUTCOMES, result
            assert runtime.error is None, runtime.error
            if sid in before.tombstones:
                seen.tombstone_reports += 1
                assert (result.outcome, result.reason) == (
                    REJECTED,
                    link.SESSION_DELETED,
                ), result
                assert len(result.item_results) == len(items)
            elif sid in before.fenced:
                seen.fenced_reports += 1
                assert (result.outcome, result.reason) == (
                    REJECTED,
                    link.SESSION_PURGED,
                ), result
            after = self.state()
            assert snapshot(engine, self.ws, before.tombstones, events=refused) == tombstones
            assert not (after.live | after.tombstones) & before.fenced

        def _item(self, kind: str, parent_id: str) -> runtime_pb2.ReportItem:
            turn_id = f"t{next(counter)}"
            if kind == "title":
                return runtime_pb2.ReportItem(
                    session_patch=runtime_pb2.SessionPatch(title=f"title {turn_id}")
                )
            if kind == "child":
                return runtime_pb2.ReportItem(
                    session_patch=runtime_pb2.SessionPatch(
                        parent_session_id=parent_id, title="child"
                    )
                )
            if kind == "message":
                return runtime_pb2.ReportItem(
                    message_snapshot=runtime_pb2.MessageSnapshot(
                        message_id=f"m-{turn_id}",
                        role=canonical_pb2.MESSAGE_ROLE_SYSTEM,
                        kind=canonical_pb2.MESSAGE_KIND_NOTICE,
                        payload_json='{"text": "x"}',
                        user_visible_assistant_response=False,
                    )
                )
            origin = canonical_pb2.TURN_ORIGIN_USER
            if kind == "settled":
                return turn_patch(
                    turn_id,
                    canonical_pb2.TURN_PHASE_SETTLED,
                    outcome=canonical_pb2.TURN_OUTCOME_COMPLETED,
                    origin=origin,
                )
            phase = (
                canonical_pb2.TURN_PHASE_QUEUED
                if kind == "queued"
                else (canonical_pb2.TURN_PHASE_RUNNING)
            )
            return turn_patch(turn_id, phase, origin=origin)

        @rule(data=st.data())
        def delete(self, data: st.DataObject) -> None:
            present = sorted(self.state().live | self.state().tombstones)
            if not present:
                return
            self.delete_ids(data.draw(st.lists(st.sampled_from(present), min_size=1, max_size=3)))

        def delete_ids(self, ids: list[str]) -> None:
            error = self.call(
                "DeleteSessions",
                host_pb2.DeleteSessionsRequest(workspace_id=self.ws, session_ids=ids),
            )
            assert error is None or error.code() == grpc.StatusCode.ABORTED, error

        @rule(data=st.data())
        def restore(self, data: st.DataObject) -> None:
            tombstones = sorted(self.state().tombstones)
            if not tombstones:
                return
            sid = data.draw(st.sampled_from(tombstones))
            error = self.call(
                "RestoreDeletedSession",
                host_pb2.RestoreDeletedSessionRequest(workspace_id=self.ws, session_id=sid),
            )
            assert error is None or error.code() == grpc.StatusCode.FAILED_PRECONDITION, error

        @rule()
        def purge(self) -> None:
            error = self.call(
                "PurgeWorkspaceTombstones",
                host_pb2.PurgeWorkspaceTombstonesRequest(workspace_id=self.ws),
            )
            assert error is None, error

        @rule(data=st.data())
        def complete_cleanup(self, data: st.DataObject) -> None:
            fenced = sorted(self.state().fenced)
            sid = data.draw(st.sampled_from(fenced or self.pool))
            error = self.call(
                "CompleteResourceCleanup",
                host_pb2.CompleteResourceCleanupRequest(workspace_id=self.ws, session_id=sid),
            )
            assert error is None, error

    return TombstoneReports


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    engine = create_sync_engine_for(migrated_db_url)
    yield engine
    engine.dispose()


@pytest.mark.spec("HOST-DEL-3", "HOST-DEL-11", "HOST-DEL-10", "HOST-CLEAN-1", "SEC-4")
def test_no_report_changes_a_tombstone_or_revives_a_fenced_id(
    migrated_db_url: str, live_server: Callable[..., LiveServer], engine: Engine
) -> None:
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    seen = Seen()
    profile = settings.default
    assert profile is not None
    run_state_machine_as_test(
        _machine(host.stub, runtime, engine, seen),
        settings=settings(
            max_examples=max(4, profile.max_examples // EXAMPLE_DIVISOR),
            stateful_step_count=STEPS,
            derandomize=True,
            # No shrinking: every replay is a run over the socket; the failing steps are
            # printed as found.
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
        ),
    )
    runtime.close()
    assert seen.tombstone_reports > 0, seen
    assert seen.fenced_reports > 0, seen
