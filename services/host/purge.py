"""Permanent deletion of tombstone trees (HOST-DEL-9, HOST-DEL-10).

``PurgeDeletedSessions`` (retention, called by maintenance) scans topmost tombstones deleted at
or before the cutoff, oldest first, in read transactions, and classifies each tree:

* **blocked** — a member is live or was deleted after the cutoff: the tree is kept whole, and
  the scan goes on, so a blocked tree never stops unrelated eligible trees;
* **not restorable** (legacy or incomplete) — left to the explicit manual purge;
* **eligible** — removed by :func:`purge_trees` in a write transaction that re-reads the
  tree under lock and removes it only if every member still has the exact ``deleted_at`` and
  generation the scan selected (a member restored and deleted again in between is not
  purged), together with one resource-cleanup outbox row per (workspace, Session). A tree is
  never split across transactions; up to ``TREES_PER_TRANSACTION`` small trees share one.

The bounds (trees, rows, bytes) are checked before each tree; the first eligible tree is
always taken even when it alone exceeds them, so a large tree cannot starve.

``PurgeWorkspaceTombstones`` (manual) checks the physical boundary instead: every reachable
descendant must be tombstoned; legacy and incomplete components are removed leaf-first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from domainerrors import FailedPrecondition, InvalidArgument
from services.host.context import HostContext
from services.host.deletion import Forest
from services.host.repository.deletion import PurgeCandidate
from services.host.repository.deletion_scope import DeletionScope, deletion_runner
from services.host.restore import not_deleted, not_topmost
from services.host.sessions import session_not_found, validate_session_id

__all__ = [
    "PurgeBounds",
    "PurgeReport",
    "TreeSelection",
    "WorkspacePurgeReport",
    "purge_deleted_sessions",
    "purge_tree",
    "purge_workspace_tombstones",
    "scan_trees",
]

DEFAULT_MAX_TREES = 100
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_COMPONENTS = 100
SCAN_BATCH = 200
TREES_PER_TRANSACTION = 64
"""Small eligible trees removed per write transaction (each tree whole; ADR 0016)."""
ROWS_PER_TRANSACTION = 20_000
"""A batch closes before it would exceed this many canonical rows (one big tree goes alone)."""
CLEANUP_REASON = "purged"
MANUAL_CLEANUP_REASON = "manual_purge"


@dataclass(frozen=True)
class PurgeBounds:
    """Limits of one ``PurgeDeletedSessions`` call (0 in the request means the default)."""

    max_trees: int = DEFAULT_MAX_TREES
    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_request(cls, max_trees: int, max_rows: int, max_bytes: int) -> PurgeBounds:
        """Apply defaults; negative values are invalid.

        Raises:
            InvalidArgument: a negative bound.
        """
        for name, value in (("max_trees", max_trees), ("max_rows", max_rows)):
            if value < 0:
                raise InvalidArgument.for_field(name, "must not be negative")
        if max_bytes < 0:
            raise InvalidArgument.for_field("max_bytes", "must not be negative")
        return cls(
            max_trees or DEFAULT_MAX_TREES,
            max_rows or DEFAULT_MAX_ROWS,
            max_bytes or DEFAULT_MAX_BYTES,
        )


@dataclass(frozen=True)
class TreeSelection:
    """An eligible tree as the scan saw it: members by level and each member's fence."""

    workspace_id: str
    topmost: str
    levels: tuple[tuple[str, ...], ...]
    fence: dict[str, tuple[int, str | None]]
    rows: int
    bytes: int
    root: str = ""
    """The tree root the scan saw (``""``: unknown, read it again under the write lock)."""

    @property
    def members(self) -> list[str]:
        """Every member, parents before children."""
        return [member for level in self.levels for member in level]


@dataclass
class PurgeReport:
    """The result of one ``PurgeDeletedSessions`` call."""

    purged: list[tuple[str, str]] = field(default_factory=list)
    purged_tree_count: int = 0
    blocked_tree_count: int = 0
    more_remaining: bool = False
    purged_row_count: int = 0
    purged_bytes: int = 0


@dataclass(frozen=True)
class ScanItem:
    """One scanned topmost tombstone: eligible (``selection``), blocked, or skipped."""

    candidate: PurgeCandidate
    selection: TreeSelection | None
    blocked: bool


async def scan_trees(
    ctx: HostContext,
    workspace_id: str | None,
    cutoff_unix_ms: int,
    *,
    after: tuple[int, str, str] | None = None,
    limit: int = SCAN_BATCH,
) -> list[ScanItem]:
    """Classify the next ``limit`` topmost tombstones at or before the cutoff (read only)."""

    async def run(scope: DeletionScope) -> list[ScanItem]:
        candidates = await scope.deletion.purge_candidates(
            workspace_id, cutoff_unix_ms, after=after, limit=limit
        )
        by_workspace: dict[str, list[PurgeCandidate]] = {}
        for candidate in candidates:
            by_workspace.setdefault(candidate.workspace_id, []).append(candidate)
        forests: dict[str, Forest] = {}
        volumes: dict[tuple[str, str], tuple[int, int]] = {}
        for ws, group in by_workspace.items():
            forest = Forest(await scope.deletion.tree_rows(ws, {c.root_session_id for c in group}))
            forests[ws] = forest
            members = [m for c in group for m in forest.subtree(c.session_id)]
            for sid, volume in (await scope.deletion.volume_by_session(ws, members)).items():
                volumes[(ws, sid)] = volume
        items: list[ScanItem] = []
        for candidate in candidates:
            forest = forests[candidate.workspace_id]
            levels = forest.levels(candidate.session_id)
            rows = [forest.rows[m] for level in levels for m in level]
            if any(
                row.is_live
                or row.deleted_at_unix_ms is None
                or row.deleted_at_unix_ms > cutoff_unix_ms
                for row in rows
            ):
                items.append(ScanItem(candidate, None, True))
                continue
            if not forest.verdict(candidate.session_id).restorable:
                items.append(ScanItem(candidate, None, False))  # left to HOST-DEL-10
                continue
            counted = [volumes[(candidate.workspace_id, row.session_id)] for row in rows]
            selection = TreeSelection(
                workspace_id=candidate.workspace_id,
                topmost=candidate.session_id,
                levels=tuple(tuple(level) for level in levels),
                fence={
                    row.session_id: (int(row.deleted_at_unix_ms or 0), row.deletion_generation)
                    for row in rows
                },
                rows=sum(volume[0] for volume in counted),
                bytes=sum(volume[1] for volume in counted),
                root=candidate.root_session_id,
            )
            items.append(ScanItem(candidate, selection, False))
        return items

    return await deletion_runner(ctx.database.engine).run(run, write=False)


class _Changed(Exception):
    """A delete removed other rows than the verified trees: roll the batch back."""


async def purge_trees(
    ctx: HostContext, selections: list[TreeSelection], *, reason: str = ""
) -> set[str]:
    """Remove selected trees in one transaction, each whole and fenced (HOST-DEL-9).

    Every tree is re-read under lock (``FOR UPDATE`` on Postgres, the write lock on SQLite)
    and kept — not removed — when it changed after selection: a member restored, deleted
    again (another ``deleted_at`` or generation), added or gone, or it is no longer topmost.
    The verified trees are then deleted leaf-first together with one cleanup-outbox row per
    (workspace, Session). A tree is never split across transactions; several trees may share
    one, which is what makes a large purge cheap (ADR 0016).

    Returns:
        The topmost ids of the trees removed (all in one workspace per call).
    """
    if not selections:
        return set()
    ws = selections[0].workspace_id

    async def run(scope: DeletionScope) -> set[str]:
        # The scan's root is a hint (a Session's root never changes while it exists); a
        # selection without one costs a read. Either way the tree is verified below against
        # the rows read under lock: a topmost missing from them is kept, never removed.
        unknown = [selection.topmost for selection in selections if not selection.root]
        roots = await scope.deletion.roots_of(ws, unknown) if unknown else {}
        roots.update({s.topmost: s.root for s in selections if s.root})
        forest = Forest(await scope.deletion.tree_rows(ws, set(roots.values()), lock=True))
        verified: list[TreeSelection] = []
        for selection in selections:
            if selection.topmost not in forest.rows or not forest.is_topmost_tombstone(
                selection.topmost
            ):
                continue
            members = forest.subtree(selection.topmost)
            if set(members) != set(selection.fence) or any(
                (forest.rows[m].deleted_at_unix_ms, forest.rows[m].deletion_generation)
                != selection.fence[m]
                for m in members
            ):
                continue  # the exact-deleted_at fence: this tree changed, keep it whole
            verified.append(selection)
        depth = max((len(selection.levels) for selection in verified), default=0)
        levels = [
            [m for selection in verified if i < len(selection.levels) for m in selection.levels[i]]
            for i in range(depth)
        ]
        expected = sum(len(selection.fence) for selection in verified)
        # The rows are locked and verified, so deleting by id removes exactly them.
        if await scope.deletion.delete_sessions(ws, levels) != expected:
            raise _Changed
        await scope.deletion.insert_cleanup_rows(
            ws,
            [m for selection in verified for m in selection.members],
            ctx.clock(),
            reason or CLEANUP_REASON,
        )
        return {selection.topmost for selection in verified}

    try:
        return await deletion_runner(ctx.database.engine).run(run)
    except _Changed:
        return set()


async def purge_tree(ctx: HostContext, selection: TreeSelection, *, reason: str = "") -> bool:
    """Remove one selected tree in its own transaction (see :func:`purge_trees`).

    Returns:
        ``True`` when the whole tree was removed; ``False`` when it changed after selection.
    """
    return selection.topmost in await purge_trees(ctx, [selection], reason=reason)


async def purge_deleted_sessions(
    ctx: HostContext,
    workspace_id: str | None,
    cutoff_unix_ms: int,
    bounds: PurgeBounds,
    *,
    dry_run: bool = False,
    trees_per_transaction: int = TREES_PER_TRANSACTION,
) -> PurgeReport:
    """``PurgeDeletedSessions``: whole restorable trees, oldest first, within the bounds.

    ``trees_per_transaction`` caps how many small trees share one write transaction (1 gives
    a transaction per tree); a tree larger than ``ROWS_PER_TRANSACTION`` always goes alone.
    """
    report = PurgeReport()
    pending: list[TreeSelection] = []
    pending_rows = 0

    async def flush() -> None:
        nonlocal pending, pending_rows
        batch, pending, pending_rows = pending, [], 0
        if not batch:
            return
        removed = batch if dry_run else None
        if removed is None:
            done: set[str] = set()
            for workspace in dict.fromkeys(s.workspace_id for s in batch):
                done |= await purge_trees(ctx, [s for s in batch if s.workspace_id == workspace])
            removed = [s for s in batch if s.topmost in done]
            report.blocked_tree_count += len(batch) - len(removed)
        for selection in removed:
            report.purged.extend((selection.workspace_id, m) for m in selection.members)
            report.purged_tree_count += 1
            report.purged_row_count += selection.rows
            report.purged_bytes += selection.bytes

    after: tuple[int, str, str] | None = None
    taken = rows = size = 0
    while True:
        items = await scan_trees(ctx, workspace_id, cutoff_unix_ms, after=after)
        if not items:
            await flush()
            return report
        for item in items:
            if item.blocked:
                report.blocked_tree_count += 1
                continue
            selection = item.selection
            if selection is None:
                continue
            if taken >= bounds.max_trees or (
                taken > 0
                and (
                    rows + selection.rows > bounds.max_rows
                    or size + selection.bytes > bounds.max_bytes
                )
            ):
                report.more_remaining = True
                await flush()
                return report
            taken, rows, size = taken + 1, rows + selection.rows, size + selection.bytes
            if pending and (
                len(pending) >= trees_per_transaction
                or pending_rows + selection.rows > ROWS_PER_TRANSACTION
            ):
                await flush()
            pending.append(selection)
            pending_rows += selection.rows
        last = items[-1].candidate
        after = (last.deleted_at_unix_ms, last.workspace_id, last.session_id)


# --------------------------------------------------------------------------- manual purge


@dataclass
class WorkspacePurgeReport:
    """The result of one ``PurgeWorkspaceTombstones`` call."""

    purged_session_ids: list[str] = field(default_factory=list)
    purged_component_count: int = 0
    blocked_component_count: int = 0
    more_remaining: bool = False


def boundary_violation(session_id: str, live: list[str]) -> FailedPrecondition:
    """FAILED_PRECONDITION ``PURGE_BOUNDARY_VIOLATION``: a reachable descendant is live."""
    return FailedPrecondition(
        f"the deleted tree of {session_id!r} still has {len(live)} live descendant(s)",
        reason="PURGE_BOUNDARY_VIOLATION",
        metadata={"session_id": session_id, "live_session_count": str(len(live))},
    )


async def _purge_component(
    ctx: HostContext, workspace_id: str, session_id: str, *, dry_run: bool, strict: bool
) -> list[str] | None:
    """Remove one topmost component leaf-first in one transaction (HOST-DEL-10).

    Returns:
        The removed ids, or ``None`` when a reachable descendant is live (``strict=False``).
    """

    async def run(scope: DeletionScope) -> list[str] | None:
        roots = await scope.deletion.roots_of(workspace_id, [session_id])
        if session_id not in roots:
            if strict:
                raise session_not_found(workspace_id, session_id)
            return []
        forest = Forest(
            await scope.deletion.tree_rows(workspace_id, [roots[session_id]], lock=True)
        )
        if forest.rows[session_id].is_live:
            if strict:
                raise not_deleted(session_id)
            return []
        if not forest.is_topmost_tombstone(session_id):
            if strict:
                raise not_topmost(session_id)
            return []
        levels = forest.levels(session_id)
        members = [m for level in levels for m in level]
        live = [m for m in members if forest.rows[m].is_live]
        if live:
            if strict:
                raise boundary_violation(session_id, live)
            return None
        if not dry_run:
            await scope.deletion.delete_sessions(workspace_id, levels)
            await scope.deletion.insert_cleanup_rows(
                workspace_id, members, ctx.clock(), MANUAL_CLEANUP_REASON
            )
        return members

    return await deletion_runner(ctx.database.engine).run(run, write=not dry_run)


async def purge_workspace_tombstones(
    ctx: HostContext,
    workspace_id: str,
    session_id: str | None,
    max_components: int,
    *,
    dry_run: bool = False,
) -> WorkspacePurgeReport:
    """``PurgeWorkspaceTombstones``: one topmost component, or every one in the workspace.

    Raises:
        InvalidArgument: a negative bound or malformed id.
        NotFound: ``SESSION_NOT_FOUND`` (targeted).
        FailedPrecondition: ``SESSION_NOT_DELETED``, ``NOT_TOPMOST_TOMBSTONE`` or
            ``PURGE_BOUNDARY_VIOLATION`` (targeted).
    """
    if max_components < 0:
        raise InvalidArgument.for_field("max_components", "must not be negative")
    bound = max_components or DEFAULT_MAX_COMPONENTS
    report = WorkspacePurgeReport()
    if session_id is not None:
        validate_session_id(session_id)
        members = await _purge_component(
            ctx, workspace_id, session_id, dry_run=dry_run, strict=True
        )
        report.purged_session_ids.extend(members or [])
        report.purged_component_count = 1
        return report
    after: tuple[int, str, str] | None = None
    while True:

        async def scan(
            scope: DeletionScope, cursor: tuple[int, str, str] | None = after
        ) -> list[PurgeCandidate]:
            return await scope.deletion.purge_candidates(
                workspace_id, None, after=cursor, limit=SCAN_BATCH
            )

        candidates = await deletion_runner(ctx.database.engine).run(scan, write=False)
        if not candidates:
            return report
        for candidate in candidates:
            if report.purged_component_count >= bound:
                report.more_remaining = True
                return report
            members = await _purge_component(
                ctx, workspace_id, candidate.session_id, dry_run=dry_run, strict=False
            )
            if members is None:
                report.blocked_component_count += 1
            elif members:
                report.purged_session_ids.extend(members)
                report.purged_component_count += 1
        last = candidates[-1]
        after = (last.deleted_at_unix_ms, last.workspace_id, last.session_id)
