"""Canonical delete: closure plans, quiescing and lossless tombstones (HOST-DEL-1..6).

``DeleteSessions`` is one command for single and batch delete. It runs in three steps:

1. **Plan** (a read transaction): the complete descendant closure of the requested ids, which
   of its members are live (to be newly deleted), which already-deleted descendant components
   are absorbed (HOST-DEL-5), and the components of the delete set by connectivity
   (HOST-DEL-3). An id that is not in the workspace fails the whole call before any change.
2. **Quiesce** under the mutation lane of every newly deleted Session (HOST-LANE-1), so no
   submission, stop, settings update or runtime report of those Sessions interleaves.
3. **Commit** (one write transaction): the trees are re-read under lock and the plan is
   recomputed; any difference is ``ABORTED STALE_DELETE_PLAN`` (a retry re-plans). Then the
   work that cannot become live again is terminalized — active Turns ``interrupted`` (with an
   ``interrupt_turn`` command to a connected runtime through the outbox), open Interactions
   ``superseded``, unacknowledged runtime commands and pending Host operations settled, and a
   ``release_session`` command written for every deleted Session that ran (ADR 0016 §14) — and
   every component gets one fresh generation, one ``deleted_at`` and its size, without
   touching ``updated_at`` or placement. One durable ``session_deleted`` event row per newly
   deleted Session is written in the same transaction by the activity log (HOST-DEL-6;
   absorbed members get none).

The tree rules (restorable verdict, components) are pure functions over :class:`Forest`, shared
by restore, listing and purge.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from domainerrors import Aborted, FieldViolation, InvalidArgument
from services.host.context import HostContext
from services.host.model.session_rules import session_not_found, validate_session_id
from services.host.repository.deletion import TreeRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import InterruptReason, InterruptTurn, ReleaseSession
from services.host.turns import command_outbox, lifecycle

__all__ = [
    "MAX_DELETE_IDS",
    "RELEASE_REASON_SESSION_DELETED",
    "STALE_DELETE_PLAN",
    "DeletePlan",
    "DeletedMember",
    "DeletionResult",
    "Forest",
    "Verdict",
    "commit_plan",
    "compute_plan",
    "delete_sessions",
    "make_plan",
    "stale_plan",
]

MAX_DELETE_IDS = 1000
RELEASE_REASON_SESSION_DELETED = "session_deleted"
"""``ReleaseSessionCommand.reason`` of the release a delete sends for each Session that ran."""
STALE_DELETE_PLAN = "STALE_DELETE_PLAN"
"""ErrorInfo reason of the ABORTED a delete plan gone stale raises (:func:`stale_plan`)."""
STALE_PLAN_RETRY_SECONDS = 0.1
"""RetryInfo of ``STALE_DELETE_PLAN``: the closure changed; re-planning is immediate."""


# --------------------------------------------------------------------------- tree rules


@dataclass(frozen=True)
class Verdict:
    """The HOST-DEL-8 verdict of one topmost tombstone's tree.

    Attributes:
        members: the tree (the topmost and every descendant, live or not), parents first.
        restorable: every member shares one generation and ``deleted_at``, the tree's size
            equals ``component_size`` and none is a legacy tombstone.
        reason: ``legacy`` | ``generation_mismatch`` | ``size_mismatch`` when not restorable.
    """

    members: tuple[str, ...]
    restorable: bool
    reason: str | None


class Forest:
    """Session trees as :class:`TreeRow` values, with the deletion rules over them."""

    def __init__(self, rows: Iterable[TreeRow]) -> None:
        self.rows: dict[str, TreeRow] = {row.session_id: row for row in rows}
        self.children: dict[str, list[str]] = {}
        for session_id in sorted(self.rows):
            parent = self.rows[session_id].parent_session_id
            if parent is not None:
                self.children.setdefault(parent, []).append(session_id)

    def levels(self, session_id: str) -> list[list[str]]:
        """The subtree of ``session_id`` level by level (the Session itself first)."""
        levels: list[list[str]] = []
        frontier = [session_id]
        seen = {session_id}
        while frontier:
            levels.append(frontier)
            following: list[str] = []
            for parent in frontier:
                for child in self.children.get(parent, ()):
                    if child not in seen:
                        seen.add(child)
                        following.append(child)
            frontier = following
        return levels

    def subtree(self, session_id: str) -> list[str]:
        """The subtree of ``session_id``, parents before children."""
        return [member for level in self.levels(session_id) for member in level]

    def depth(self, session_id: str) -> int:
        """Distance from the tree's root (cycles cannot exist: a Session is its own root)."""
        depth, row = 0, self.rows[session_id]
        while row.parent_session_id is not None and row.parent_session_id in self.rows:
            depth += 1
            row = self.rows[row.parent_session_id]
        return depth

    def is_topmost_tombstone(self, session_id: str) -> bool:
        """A root tombstone, or a child tombstone whose parent is live (HOST-DEL-7)."""
        row = self.rows[session_id]
        if row.is_live:
            return False
        parent = self.rows.get(row.parent_session_id) if row.parent_session_id else None
        return parent is None or parent.is_live

    def verdict(self, session_id: str) -> Verdict:
        """Whether the tree of the tombstone ``session_id`` is one complete component."""
        members = tuple(self.subtree(session_id))
        rows = [self.rows[member] for member in members]
        if any(row.tombstone_legacy for row in rows):
            return Verdict(members, False, "legacy")
        identities = {(row.deleted_at_unix_ms, row.deletion_generation) for row in rows}
        if any(row.is_live or row.deletion_generation is None for row in rows) or (
            len(identities) != 1
        ):
            return Verdict(members, False, "generation_mismatch")
        if any(row.component_size != len(members) for row in rows):
            return Verdict(members, False, "size_mismatch")
        return Verdict(members, True, None)


@dataclass(frozen=True)
class DeletePlan:
    """What one delete will do, and the closure state it was computed from.

    Attributes:
        workspace_id: the workspace.
        requested: requested ids, deduplicated, in request order.
        roots: root ids of the trees the closure lies in (what the commit re-reads).
        newly: live closure members; they are quiesced and newly tombstoned.
        absorbed: members of complete recoverable descendant components (HOST-DEL-5).
        already_deleted: requested ids that were tombstoned and are not absorbed (no-op).
        components: the delete set split by connectivity, each parents first.
        fingerprint: the closure state; the commit refuses to act on a changed one.
    """

    workspace_id: str
    requested: tuple[str, ...]
    roots: frozenset[str]
    newly: tuple[str, ...]
    absorbed: tuple[str, ...]
    already_deleted: tuple[str, ...]
    components: tuple[tuple[str, ...], ...]
    parents: dict[str, str | None]
    fingerprint: frozenset[tuple[object, ...]]

    @property
    def changes_nothing(self) -> bool:
        """A repeated delete: nothing to tombstone or absorb (HOST-DEL-4)."""
        return not self.newly and not self.absorbed


def compute_plan(
    workspace_id: str, requested: Sequence[str], forest: Forest, roots: Iterable[str]
) -> DeletePlan:
    """The plan for ``requested`` over ``forest`` (every id must be in the forest)."""
    closure = _closure(requested, forest)
    newly = [member for member in closure if forest.rows[member].is_live]
    newly_set = set(newly)
    absorbed = _absorbed(closure, forest, newly_set)
    absorbed_set = set(absorbed)
    already = [
        session_id
        for session_id in requested
        if not forest.rows[session_id].is_live and session_id not in absorbed_set
    ]
    return DeletePlan(
        workspace_id=workspace_id,
        requested=tuple(requested),
        roots=frozenset(roots),
        newly=tuple(newly),
        absorbed=tuple(absorbed),
        already_deleted=tuple(already),
        components=_components(closure, newly_set | absorbed_set, forest),
        parents={member: forest.rows[member].parent_session_id for member in closure},
        fingerprint=_fingerprint(closure, forest),
    )


def _closure(requested: Sequence[str], forest: Forest) -> list[str]:
    """The requested Sessions and all their descendants, each once, in request order."""
    closure: list[str] = []
    seen: set[str] = set()
    for session_id in requested:
        for member in forest.subtree(session_id):
            if member not in seen:
                seen.add(member)
                closure.append(member)
    return closure


def _absorbed(closure: list[str], forest: Forest, newly: set[str]) -> list[str]:
    """Members of the recoverable tombstoned components directly under a newly deleted member."""
    absorbed: list[str] = []
    for member in closure:
        row = forest.rows[member]
        if row.is_live or row.parent_session_id not in newly:
            continue
        verdict = forest.verdict(member)
        if verdict.restorable:  # legacy or incomplete components are never upgraded
            absorbed.extend(verdict.members)
    return absorbed


def _components(
    closure: list[str], delete_set: set[str], forest: Forest
) -> tuple[tuple[str, ...], ...]:
    """The delete set split by connectivity, each component parents first."""
    # Union-find over parent edges inside the exact delete set (HOST-DEL-3).
    leader: dict[str, str] = {member: member for member in delete_set}

    def find(member: str) -> str:
        while leader[member] != member:
            leader[member] = leader[leader[member]]
            member = leader[member]
        return member

    for member in delete_set:
        parent = forest.rows[member].parent_session_id
        if parent is not None and parent in delete_set:
            leader[find(member)] = find(parent)
    grouped: dict[str, list[str]] = {}
    for member in closure:
        if member in delete_set:
            grouped.setdefault(find(member), []).append(member)
    depth = {member: forest.depth(member) for member in delete_set}
    return tuple(
        tuple(sorted(members, key=lambda m: (depth[m], m))) for members in grouped.values()
    )


def _fingerprint(closure: list[str], forest: Forest) -> frozenset[tuple[object, ...]]:
    """The closure's tree and tombstone state, compared again at commit."""
    return frozenset(
        (
            member,
            forest.rows[member].parent_session_id,
            forest.rows[member].deleted_at_unix_ms,
            forest.rows[member].deletion_generation,
            forest.rows[member].component_size,
            forest.rows[member].tombstone_legacy,
        )
        for member in closure
    )


# ------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class DeletedMember:
    """One tombstoned Session of a delete (HOST-DEL-1, HOST-DEL-3)."""

    session_id: str
    parent_session_id: str | None
    requested: bool
    deleted_at_unix_ms: int
    generation: str
    component_size: int


@dataclass(frozen=True)
class DeletionResult:
    """The complete typed result of one delete command (HOST-DEL-1)."""

    deleted: tuple[DeletedMember, ...] = ()
    absorbed: tuple[DeletedMember, ...] = ()
    already_deleted_session_ids: tuple[str, ...] = ()
    interrupted_turn_ids: tuple[str, ...] = ()
    superseded_interaction_count: int = 0


# ------------------------------------------------------------------------------ commands


def validate_delete_ids(session_ids: Sequence[str]) -> tuple[str, ...]:
    """Deduplicate (keeping order) and validate 1..1000 ids.

    Raises:
        InvalidArgument: no ids, too many, or a malformed id.
    """
    unique = tuple(dict.fromkeys(session_ids))
    if not unique:
        raise InvalidArgument.for_field("session_ids", "must name at least one Session")
    if len(unique) > MAX_DELETE_IDS:
        raise InvalidArgument.for_field(
            "session_ids", f"must name at most {MAX_DELETE_IDS} Sessions"
        )
    violations: list[FieldViolation] = []
    for session_id in unique:
        try:
            validate_session_id(session_id, "session_ids")
        except InvalidArgument as error:
            violations.extend(error.field_violations)
    if violations:
        raise InvalidArgument("invalid session_ids", field_violations=violations[:1])
    return unique


async def _plan_in(
    scope: HostTransaction, workspace_id: str, requested: Sequence[str]
) -> DeletePlan:
    roots = await scope.deletion.roots_of(workspace_id, requested)
    for session_id in requested:
        if session_id not in roots:
            raise session_not_found(workspace_id, session_id)
    forest = Forest(await scope.deletion.tree_rows(workspace_id, roots.values()))
    return compute_plan(workspace_id, requested, forest, roots.values())


async def make_plan(ctx: HostContext, workspace_id: str, requested: Sequence[str]) -> DeletePlan:
    """Step 1: plan the delete in a read transaction.

    Raises:
        NotFound: ``SESSION_NOT_FOUND`` for an id not in the workspace (nothing changes).
    """

    async def run(scope: HostTransaction) -> DeletePlan:
        return await _plan_in(scope, workspace_id, requested)

    return await ctx.transact(run, write=False)


def stale_plan(workspace_id: str) -> Aborted:
    """ABORTED ``STALE_DELETE_PLAN`` with RetryInfo: the caller retries, Host re-plans."""
    return Aborted(
        "the Sessions to delete changed after the delete was planned; retry",
        reason=STALE_DELETE_PLAN,
        metadata={"workspace_id": workspace_id},
        retry_after_seconds=STALE_PLAN_RETRY_SECONDS,
    )


async def commit_plan(ctx: HostContext, plan: DeletePlan) -> DeletionResult:
    """Step 3: verify the plan and tombstone in one write transaction.

    The caller holds the mutation lanes of ``plan.newly`` (:func:`delete_sessions` does).

    Raises:
        Aborted: ``STALE_DELETE_PLAN`` when the closure differs from the plan.
    """
    workspace_id = plan.workspace_id

    async def run(scope: HostTransaction) -> DeletionResult:
        forest = await _verified_forest(scope, plan)
        now = ctx.clock()
        newly = list(plan.newly)
        _, superseded = await scope.deletion.open_interaction_turns(workspace_id, newly)
        # Commands already written for these Sessions must never reach a runtime now.
        await scope.deletion.settle_runtime_commands(workspace_id, newly, now)
        await scope.deletion.settle_host_operations(workspace_id, newly, now)
        active = await scope.deletion.active_turn_keys(workspace_id, newly)
        await _interrupt_active_turns(ctx, scope, workspace_id, active, now)
        # The runtime drops the provider session of every deleted Session that ran (after
        # its interrupt, which is older in the outbox); restore withdraws an undelivered one.
        await command_outbox.enqueue_many(
            scope,
            ctx,
            await scope.deletion.runtime_sessions(workspace_id, newly),
            ReleaseSession(RELEASE_REASON_SESSION_DELETED),
            now=now,
        )
        turns, _ = await scope.deletion.open_interaction_turns(workspace_id, newly)
        for session_id, turn_id in turns:
            turn = await scope.turns.get(workspace_id, session_id, turn_id)
            if turn is not None:
                await lifecycle.close_open_interactions(scope, turn, "superseded", now)
        await scope.session_rows.flush()
        # Settling moves the Sessions' updated_at; delete never rewrites it (HOST-DEL-3).
        await scope.deletion.keep_updated_at(
            workspace_id, {m: forest.rows[m].updated_at_unix_ms for m in newly}
        )
        deleted, absorbed = await _tombstone_components(scope, plan, now)
        return DeletionResult(
            deleted=deleted,
            absorbed=absorbed,
            already_deleted_session_ids=plan.already_deleted,
            interrupted_turn_ids=tuple(turn_id for _, turn_id in active),
            superseded_interaction_count=superseded,
        )

    return await ctx.transact(run)


async def _verified_forest(scope: HostTransaction, plan: DeletePlan) -> Forest:
    """The plan's trees, locked, once they are shown unchanged since planning.

    Raises:
        Aborted: ``STALE_DELETE_PLAN`` when the closure differs from the plan.
    """
    workspace_id = plan.workspace_id
    forest = Forest(await scope.deletion.tree_rows(workspace_id, plan.roots, lock=True))
    if any(session_id not in forest.rows for session_id in plan.requested):
        raise stale_plan(workspace_id)
    current = compute_plan(workspace_id, plan.requested, forest, plan.roots)
    if current.fingerprint != plan.fingerprint:
        raise stale_plan(workspace_id)
    return forest


async def _interrupt_active_turns(
    ctx: HostContext,
    scope: HostTransaction,
    workspace_id: str,
    active: Sequence[tuple[str, str]],
    now: int,
) -> None:
    """Settle the active Turns ``interrupted`` and queue an ``interrupt_turn`` for each."""
    for session_id, turn_id in active:
        session = await scope.session_rows.get(workspace_id, session_id)
        turn = await scope.turns.get(workspace_id, session_id, turn_id)
        if session is None or turn is None or not lifecycle.is_active(turn):
            continue  # settled already, as a child of an interrupted root Turn
        await lifecycle.settle(
            scope, session, turn, "interrupted", now,
            open_interactions_become="superseded",
        )  # fmt: skip
    for session_id, turn_id in active:
        # Tell a connected runtime through the durable command path (HOST-RT-1).
        session = await scope.session_rows.get(workspace_id, session_id)
        if session is not None:
            command_outbox.enqueue(
                scope,
                ctx,
                session,
                InterruptTurn(turn_id, InterruptReason.SESSION_DELETED),
            )


async def _tombstone_components(
    scope: HostTransaction, plan: DeletePlan, now: int
) -> tuple[tuple[DeletedMember, ...], tuple[DeletedMember, ...]]:
    """Tombstone each component under a new generation; ``(deleted, absorbed)`` members."""
    workspace_id = plan.workspace_id
    requested = set(plan.requested)
    absorbed_set = set(plan.absorbed)
    deleted: list[DeletedMember] = []
    absorbed: list[DeletedMember] = []
    for component in plan.components:
        generation = f"gen-{uuid.uuid4().hex}"
        size = len(component)
        await scope.deletion.tombstone(
            workspace_id,
            component,
            deleted_at_unix_ms=now,
            generation=generation,
            component_size=size,
        )
        for member in component:
            record = DeletedMember(
                member, plan.parents[member], member in requested, now, generation, size
            )
            if member in absorbed_set:
                absorbed.append(record)
                continue
            deleted.append(record)
            scope.deletion.note_deleted(workspace_id, member, generation, now)
    return tuple(deleted), tuple(absorbed)


async def delete_sessions(
    ctx: HostContext, workspace_id: str, session_ids: Sequence[str]
) -> DeletionResult:
    """``DeleteSessions``: plan, quiesce exactly the closure, commit (HOST-DEL-1..6).

    Raises:
        InvalidArgument: no ids, more than 1000, or a malformed id.
        NotFound: ``SESSION_NOT_FOUND`` for any id not in the workspace (before any change).
        Aborted: ``STALE_DELETE_PLAN`` (RetryInfo) when the closure changed meanwhile.
    """
    requested = validate_delete_ids(session_ids)
    plan = await make_plan(ctx, workspace_id, requested)
    if plan.changes_nothing:
        return DeletionResult(already_deleted_session_ids=plan.already_deleted)
    async with ctx.lanes.hold_many((workspace_id, member) for member in plan.newly):
        return await commit_plan(ctx, plan)
