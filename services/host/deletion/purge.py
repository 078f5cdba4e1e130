"""Permanent deletion of tombstone trees (HOST-DEL-9, HOST-DEL-10).

``PurgeDeletedSessions`` (retention, called by maintenance) scans topmost tombstones deleted at
or before the cutoff, oldest first, in read transactions, and classifies each tree:

* **blocked** — a member is live or was deleted after the cutoff: the tree is kept whole, and
  the scan goes on, so a blocked tree never stops unrelated eligible trees;
* **not restorable** (legacy or incomplete) — left to the explicit manual purge;
* **eligible** — its tree is exactly one restorable component, removed by :func:`purge_trees`
  with one fenced ``DELETE`` (root, generation and the exact ``deleted_at`` the scan selected,
  so a member restored and deleted again in between is not purged), together with one
  resource-cleanup outbox row per (workspace, Session). A tree is never split across
  transactions; up to ``TREES_PER_TRANSACTION`` small trees share one, and a batch in which
  any tree changed is rolled back and retried one tree per transaction.

The scan decides most candidates from per-component aggregates
(``services.host.repository.purge``) and reads tree rows into a :class:`Forest` only for the
rest; see ADR 0016 §6.

The bounds (trees, rows, bytes) are checked before each tree; the first eligible tree is
always taken even when it alone exceeds them, so a large tree cannot starve.

``PurgeWorkspaceTombstones`` (manual) checks the physical boundary instead: every reachable
descendant must be tombstoned; legacy and incomplete components are removed leaf-first.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from domainerrors import FailedPrecondition, InvalidArgument
from services.host.context import HostContext
from services.host.deletion.delete import Forest
from services.host.deletion.restore import not_deleted, not_topmost
from services.host.model.session_rules import session_not_found, validate_session_id
from services.host.repository.deletion import PurgeCandidate, WorkspaceFilter
from services.host.repository.purge import ComponentFence, ComponentShape
from services.host.repository.unit_of_work import HostTransaction

__all__ = [
    "PurgeBounds",
    "PurgeReport",
    "TreeSelection",
    "WorkspacePurgeReport",
    "purge_deleted_sessions",
    "purge_tree",
    "purge_workspace_tombstones",
    "scan_trees",
    "slice_rows",
]

DEFAULT_MAX_TREES = 100
DEFAULT_MAX_ROWS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_COMPONENTS = 100
SCAN_BATCH = 1000
FIRST_SCAN_BATCH = 250
TREES_PER_TRANSACTION = 256
"""Small eligible trees removed per write transaction (each tree whole; ADR 0016)."""
ROWS_PER_TRANSACTION = 1_000
"""SQLite: a batch closes before it would exceed this many canonical rows (one big tree goes
alone).

The bound is the purge's *slice*: on SQLite a write transaction holds the one write slot, and
a foreground submit waits for one slice (typically milliseconds) instead of a whole purge call
(``bench/purge_interference_bench.py``). A single tree larger than the slice is still removed
in one transaction of its own size: a tree is never split."""
POSTGRES_ROWS_PER_TRANSACTION = 10_000
"""Postgres: the slice of a write transaction, in canonical rows.

Postgres has no single writer: a purge transaction locks only the rows of the trees it
removes (tombstones no foreground call writes), so a longer one delays no submit, and the
1,000-row slice only multiplied the per-transaction cost (a lock statement, a fenced
``DELETE``, a commit and the transaction's Python work, ~3 ms each): at maintenance's bounds
(100 trees / 10,000 rows per call) it made the purge 2-3x slower (``bench/deletion_bench.py``,
part ``grpc_purge``). 10,000 is maintenance's row bound, so one call is one write transaction;
larger slices measured within noise of it."""
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
    """An eligible tree as the scan saw it: one whole component, fenced by its generation."""

    workspace_id: str
    topmost: str
    root: str
    generation: str
    deleted_at_unix_ms: int
    size: int
    """Sessions in the tree (its ``component_size``)."""
    rows: int
    """Canonical rows a purge removes: the Sessions and their Turns, Messages, Interactions."""
    bytes: int
    members: tuple[str, ...] = ()
    """The Session ids; read only for a dry run (a purge learns them from its ``DELETE``)."""

    @property
    def fence(self) -> ComponentFence:
        """What the purge's ``DELETE`` matches: root, generation and exact ``deleted_at``."""
        return ComponentFence(self.root, self.generation, self.deleted_at_unix_ms)


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


def _fence_of(candidate: PurgeCandidate) -> ComponentFence | None:
    if candidate.deletion_generation is None or candidate.tombstone_legacy:
        return None
    return ComponentFence(
        candidate.root_session_id, candidate.deletion_generation, candidate.deleted_at_unix_ms
    )


def _is_whole_component(candidate: PurgeCandidate, shape: ComponentShape | None) -> bool:
    """Whether the candidate's tree is exactly its component, restorable and old enough.

    The component's members all descend from the topmost (it is their only head) and no member
    has a child outside it, so the tree *is* the component; one ``deleted_at`` (at or before the
    cutoff, as the candidate's), one size equal to the member count, no legacy member — the
    HOST-DEL-8 verdict, decided from aggregates instead of the rows.
    """
    size = candidate.component_size
    return (
        shape is not None
        and size is not None
        and shape.members == size
        and shape.component_size_range == (size, size)
        and shape.deleted_at_range == (candidate.deleted_at_unix_ms,) * 2
        and shape.legacy_members == 0
        and shape.foreign_children == 0
        and shape.heads == 1
    )


async def scan_trees(
    ctx: HostContext,
    workspaces: WorkspaceFilter,
    cutoff_unix_ms: int,
    *,
    after: tuple[int, str, str] | None = None,
    limit: int = SCAN_BATCH,
    with_members: bool = False,
) -> list[ScanItem]:
    """Classify the next ``limit`` topmost tombstones at or before the cutoff (read only).

    A candidate whose component aggregates show a whole, clean tree is eligible without reading
    its rows; any other candidate (rare: a live, legacy, too-new or foreign descendant) is
    classified from its tree's rows with :class:`Forest`. ``with_members`` also reads each
    eligible tree's Session ids (for a dry run).
    """

    async def run(scope: HostTransaction) -> list[ScanItem]:
        candidates = await scope.deletion.purge_candidates(
            workspaces, cutoff_unix_ms, after=after, limit=limit
        )
        by_workspace: dict[str, list[PurgeCandidate]] = {}
        for candidate in candidates:
            by_workspace.setdefault(candidate.workspace_id, []).append(candidate)
        decided: dict[tuple[str, str], ScanItem] = {}
        for ws, group in by_workspace.items():
            fenced = [(candidate, _fence_of(candidate)) for candidate in group]
            fences = [fence for _, fence in fenced if fence is not None]
            shapes = await scope.purge.component_shapes(ws, fences) if fences else {}
            eligible: list[tuple[PurgeCandidate, ComponentFence]] = []
            rest: list[PurgeCandidate] = []
            for candidate, fence in fenced:
                if fence is not None and _is_whole_component(
                    candidate, shapes.get(fence.generation)
                ):
                    eligible.append((candidate, fence))
                else:
                    rest.append(candidate)
            if rest:
                forest = Forest(
                    await scope.deletion.tree_rows(ws, {c.root_session_id for c in rest})
                )
                for candidate in rest:
                    verdict = _classify(forest, candidate, cutoff_unix_ms)
                    if isinstance(verdict, ComponentFence):
                        eligible.append((candidate, verdict))
                    else:
                        decided[(ws, candidate.session_id)] = ScanItem(candidate, None, verdict)
            chosen = [fence for _, fence in eligible]
            # The shapes carry their components' volume; only a tree classified from its rows
            # (rare) may need its own volume statement.
            volumes = {
                generation: (shape.owned_rows, shape.payload_bytes)
                for generation, shape in shapes.items()
            }
            unmeasured = [fence for fence in chosen if fence.generation not in volumes]
            if unmeasured:
                volumes.update(await scope.purge.component_volumes(ws, unmeasured))
            members = (
                await scope.purge.component_members(ws, chosen) if chosen and with_members else {}
            )
            for candidate, fence in eligible:
                size = candidate.component_size or 0
                rows, size_bytes = volumes.get(fence.generation, (0, 0))
                selection = TreeSelection(
                    workspace_id=ws,
                    topmost=candidate.session_id,
                    root=fence.root_session_id,
                    generation=fence.generation,
                    deleted_at_unix_ms=fence.deleted_at_unix_ms,
                    size=size,
                    rows=size + rows,
                    bytes=size_bytes,
                    members=tuple(members.get(fence.generation, ())),
                )
                decided[(ws, candidate.session_id)] = ScanItem(candidate, selection, False)
        return [decided[(c.workspace_id, c.session_id)] for c in candidates]

    return await ctx.transact(run, write=False)


def _classify(
    forest: Forest, candidate: PurgeCandidate, cutoff_unix_ms: int
) -> ComponentFence | bool:
    """A candidate's tree from its rows: its fence when eligible, else why it is not.

    An ineligible tree is either blocked (a live or too-new member) or not restorable (left to
    HOST-DEL-10).
    """
    members = forest.subtree(candidate.session_id)
    rows = [forest.rows[m] for m in members]
    if any(
        row.is_live or row.deleted_at_unix_ms is None or row.deleted_at_unix_ms > cutoff_unix_ms
        for row in rows
    ):
        return True
    if not forest.verdict(candidate.session_id).restorable:
        return False
    topmost = forest.rows[candidate.session_id]
    return ComponentFence(
        topmost.root_session_id,
        str(topmost.deletion_generation),
        int(topmost.deleted_at_unix_ms or 0),
    )


class _Changed(Exception):
    """A selected component changed after the scan: roll the batch back."""


async def purge_trees(
    ctx: HostContext, selections: list[TreeSelection], *, reason: str = ""
) -> dict[str, list[str]]:
    """Remove selected trees in one transaction, each whole and fenced (HOST-DEL-9).

    The tree roots are locked first (Postgres ``FOR UPDATE``; the write lock on SQLite). A
    selected child topmost whose parent has been tombstoned meanwhile is no longer topmost and
    is kept. The rest are removed by one fenced ``DELETE`` — root, generation and the exact
    ``deleted_at`` the scan selected — with one cleanup-outbox row per (workspace, Session) in
    the same transaction. A component restored, deleted again or absorbed (a new generation)
    matches no row, and a member that gained a child outside the component makes the
    ``DELETE`` fail; either way the batch rolls back and each tree is retried in a transaction
    of its own, so one changed tree is kept whole without holding back the others.

    Returns:
        ``topmost -> removed Session ids`` of the trees removed (all in one workspace).
    """
    if not selections:
        return {}
    ws = selections[0].workspace_id

    async def run(scope: HostTransaction) -> dict[str, list[str]]:
        await scope.purge.lock_roots(ws, [s.root for s in selections])
        moved = await scope.purge.under_tombstoned_parent(
            ws, [s.topmost for s in selections if s.topmost != s.root]
        )
        kept = [s for s in selections if s.topmost not in moved]
        if not kept:
            return {}
        removed = await scope.purge.purge_components(
            ws, [s.fence for s in kept], ctx.clock(), reason or CLEANUP_REASON
        )
        by_generation: dict[str, list[str]] = {s.generation: [] for s in kept}
        for session_id, generation in removed:
            by_generation[generation].append(session_id)
        if any(len(by_generation[s.generation]) != s.size for s in kept):
            raise _Changed
        return {s.topmost: by_generation[s.generation] for s in kept}

    try:
        return await ctx.transact(run)
    except (_Changed, IntegrityError):
        if len(selections) == 1:
            return {}
    done: dict[str, list[str]] = {}
    for selection in selections:
        done.update(await purge_trees(ctx, [selection], reason=reason))
    return done


async def purge_tree(ctx: HostContext, selection: TreeSelection, *, reason: str = "") -> bool:
    """Remove one selected tree in its own transaction (see :func:`purge_trees`).

    Returns:
        ``True`` when the whole tree was removed; ``False`` when it changed after selection.
    """
    return selection.topmost in await purge_trees(ctx, [selection], reason=reason)


async def purge_deleted_sessions(
    ctx: HostContext,
    workspaces: WorkspaceFilter,
    cutoff_unix_ms: int,
    bounds: PurgeBounds,
    *,
    dry_run: bool = False,
    trees_per_transaction: int = TREES_PER_TRANSACTION,
) -> PurgeReport:
    """``PurgeDeletedSessions``: whole restorable trees, oldest first, within the bounds.

    ``workspaces`` is one workspace, a scoped caller's set of workspaces, or ``None`` for
    every workspace (a deployment-wide caller only; the wire passes the call's scope).

    ``trees_per_transaction`` caps how many small trees share one write transaction (1 gives
    a transaction per tree); a tree larger than the backend's slice (:func:`slice_rows`) always
    goes alone.
    """
    purge = _Purge(
        ctx,
        workspaces,
        cutoff_unix_ms,
        bounds,
        dry_run=dry_run,
        trees_per_transaction=trees_per_transaction,
    )
    return await purge.run()


def slice_rows(database_url: str) -> int:
    """Canonical rows one purge write transaction may take on this backend (a tree is whole)."""
    if make_url(database_url).get_backend_name() == "postgresql":
        return POSTGRES_ROWS_PER_TRANSACTION
    return ROWS_PER_TRANSACTION


_Scan = tuple[asyncio.Task[list[ScanItem]], int]
"""A scan in flight and the page size it asked for."""


class _Purge:
    """One ``PurgeDeletedSessions`` call: what it took of the bounds, its pending batch, report."""

    def __init__(
        self,
        ctx: HostContext,
        workspaces: WorkspaceFilter,
        cutoff_unix_ms: int,
        bounds: PurgeBounds,
        *,
        dry_run: bool,
        trees_per_transaction: int,
    ) -> None:
        self._ctx = ctx
        self._workspaces = workspaces
        self._cutoff_unix_ms = cutoff_unix_ms
        self._bounds = bounds
        self._dry_run = dry_run
        self._trees_per_transaction = trees_per_transaction
        self.report = PurgeReport()
        self._pending: list[TreeSelection] = []
        self._pending_rows = 0
        self._slice_rows = slice_rows(ctx.database.url)
        self._taken = self._rows = self._size = 0

    async def run(self) -> PurgeReport:
        """Scan page by page, reading the next page ahead while this one's trees are removed."""
        upcoming: _Scan | None = self._scan(None)
        try:
            while upcoming is not None:
                items = await upcoming[0]
                full_page = len(items) == upcoming[1]
                upcoming = None
                if not items:
                    break
                eligible = sum(1 for item in items if item.selection is not None)
                if full_page and self._taken + eligible < self._bounds.max_trees:
                    # Read the next page while this one's trees are removed: the scan is a read
                    # transaction of its own, and the fenced DELETE makes any staleness harmless.
                    upcoming = self._scan(_after(items))
                if not await self._take_page(items):
                    return self.report
                if upcoming is None and full_page:  # a short page was the last one
                    upcoming = self._scan(_after(items))
            await self._flush()
            return self.report
        finally:
            if upcoming is not None:  # a page read ahead that is no longer needed
                upcoming[0].cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await upcoming[0]

    def _scan(self, after: tuple[int, str, str] | None) -> _Scan:
        # No more candidates than the tree bound can still take (+1 to see whether more
        # remain); blocked and skipped trees take no budget, so the loop may scan again.
        first = SCAN_BATCH if after else FIRST_SCAN_BATCH
        limit = max(1, min(first, self._bounds.max_trees - self._taken + 1))
        task = asyncio.ensure_future(
            scan_trees(
                self._ctx,
                self._workspaces,
                self._cutoff_unix_ms,
                after=after,
                limit=limit,
                with_members=self._dry_run,
            )
        )
        return task, limit

    async def _take_page(self, items: list[ScanItem]) -> bool:
        """Batch a page's eligible trees; ``False`` once a bound ends the purge (flushed)."""
        for item in items:
            if item.blocked:
                self.report.blocked_tree_count += 1
                continue
            selection = item.selection
            if selection is None:
                continue
            if self._beyond_bounds(selection):
                self.report.more_remaining = True
                await self._flush()
                return False
            self._taken += 1
            self._rows += selection.rows
            self._size += selection.bytes
            if self._pending and (
                len(self._pending) >= self._trees_per_transaction
                or self._pending_rows + selection.rows > self._slice_rows
            ):
                await self._flush()
            self._pending.append(selection)
            self._pending_rows += selection.rows
        return True

    def _beyond_bounds(self, selection: TreeSelection) -> bool:
        """Whether taking ``selection`` would exceed a bound (the first tree always fits)."""
        bounds = self._bounds
        return self._taken >= bounds.max_trees or (
            self._taken > 0
            and (
                self._rows + selection.rows > bounds.max_rows
                or self._size + selection.bytes > bounds.max_bytes
            )
        )

    async def _flush(self) -> None:
        """Remove the pending batch (or, in a dry run, list it) and count it in the report."""
        batch, self._pending, self._pending_rows = self._pending, [], 0
        if not batch:
            return
        removed = await self._remove(batch)
        report = self.report
        for selection in batch:
            key = (selection.workspace_id, selection.topmost)
            if key not in removed:
                continue
            report.purged.extend((selection.workspace_id, m) for m in removed[key])
            report.purged_tree_count += 1
            report.purged_row_count += selection.rows
            report.purged_bytes += selection.bytes

    async def _remove(self, batch: list[TreeSelection]) -> dict[tuple[str, str], list[str]]:
        """``(workspace, topmost) -> removed Session ids``; changed trees count as blocked."""
        # Keyed by (workspace, topmost): the same Session id may exist in several workspaces.
        if self._dry_run:
            return {(s.workspace_id, s.topmost): list(s.members) for s in batch}
        removed: dict[tuple[str, str], list[str]] = {}
        for workspace in dict.fromkeys(s.workspace_id for s in batch):
            done = await purge_trees(self._ctx, [s for s in batch if s.workspace_id == workspace])
            removed.update(((workspace, top), ids) for top, ids in done.items())
        self.report.blocked_tree_count += len(batch) - len(removed)
        return removed


def _after(items: list[ScanItem]) -> tuple[int, str, str]:
    """The scan cursor after a page: its last candidate's ``(deleted_at, workspace, id)``."""
    last = items[-1].candidate
    return (last.deleted_at_unix_ms, last.workspace_id, last.session_id)


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

    async def run(scope: HostTransaction) -> list[str] | None:
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

    return await ctx.transact(run, write=not dry_run)


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
            scope: HostTransaction, cursor: tuple[int, str, str] | None = after
        ) -> list[PurgeCandidate]:
            return await scope.deletion.purge_candidates(
                workspace_id, None, after=cursor, limit=SCAN_BATCH
            )

        candidates = await ctx.transact(scan, write=False)
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
