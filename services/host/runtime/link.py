"""The runtime link's rules (HOST-RT-1, HOST-RT-3, HOST-RT-4): hello, reports, acks, loss.

Reports are applied atomically, in provider order, with the causal write barrier:

* non-terminal state (Session patch, Turn creation, Interaction transitions) is written in
  order, so the rows later messages reference exist first;
* immediately before a terminal Turn patch, every message of that Turn in the report is
  written (also ones listed after the patch), then the Turn settles and freezes its
  result from the durable messages (HOST-TURN-6); a root Turn whose child Turns are still
  active records the patch and settles when its last child does;
* patches after a settlement are applied after it, where they are stale replays;
* a conflicting Interaction (changed kind, tool name, input or metadata) or an invalid
  item rejects the whole report: nothing from it commits (HOST-INT-2);
* tool-call snapshots only write tool-call messages; Interactions change only through
  ``interaction_transition`` items and response dispositions, which commit in provider
  order before a terminal patch that follows them (HOST-RT-4).

A runtime that disconnects is given ``runtime_loss_grace_seconds`` to come back with the
same instance; otherwise (or at once, when it returns as a new instance) its Sessions'
active Turns settle ``interrupted`` and their open Interactions become ``superseded``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence

from sqlalchemy.exc import DataError, IntegrityError

from domainerrors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
)
from services.host.context import HostContext
from services.host.model.file_changes import encode_file_changes, file_changes_violation
from services.host.model.records import json_object
from services.host.repository.row_views import SessionRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.registry import (
    PROTOCOL_REVISION,
    CommandAck,
    RuntimeIdentity,
    RuntimeLinkHandle,
)
from services.host.runtime.reports import (
    InvalidField,
    ItemResult,
    MessageSnapshotItem,
    ReportItem,
    ReportVerdict,
    RuntimeReportInput,
    SessionLostItem,
    SessionPatchItem,
    TurnPatchItem,
)
from services.host.turns import (
    command_outbox,
    disposition_queries,
    interactions,
    lifecycle,
    messages,
)
from services.host.turns.interactions import DispositionInput, TransitionInput
from services.host.turns.tool_payload import build_tool_call_payload
from store.integrity import store_refusal

_log = logging.getLogger(__name__)

MAX_REPORT_BYTES = 8 * 1024 * 1024
"""Largest encoded report Host accepts (``RuntimeWelcome.max_report_bytes``)."""

SESSION_DELETED = "SESSION_DELETED"
"""Verdict reason of a report about a tombstoned Session: every item rejected, nothing
changed (HOST-DEL-3)."""

SESSION_PURGED = "SESSION_PURGED"
"""Verdict reason of a report about a missing Session whose id a pending resource cleanup
fences (HOST-DEL-11): nothing is created, as ``CreateSession`` refuses the id."""

INVALID_FIELD_VALUE = "INVALID_FIELD_VALUE"
"""Verdict reason of a report with an unknown enum number or a NUL character (SEC-2)."""

INVALID_MESSAGE = "INVALID_MESSAGE"
"""Verdict reason of a message snapshot Host cannot store: no id, role or kind, no
classification (HOST-MSG-1), or no Turn of its Session where one is required (HOST-MSG-7)."""

SESSION_SCOPED_KIND = "notice"
"""The only message kind a runtime may report without a Turn (HOST-MSG-7)."""

UNKNOWN_AGENT_TARGET = "UNKNOWN_AGENT_TARGET"
"""Verdict reason of a Session patch naming an unregistered target (HOST-SES-1)."""

AGENT_TARGET_PROVIDER_MISMATCH = "AGENT_TARGET_PROVIDER_MISMATCH"
"""Verdict reason of a Session patch naming a target of another provider (HOST-SES-1)."""

_REJECTING_ERRORS = (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    ResourceExhausted,
)
"""Domain errors that say the report's *content* cannot be applied: they reject the report
(nothing committed) instead of ending the link. Contention (``Unavailable``/``Aborted``)
still ends it, so the runtime re-sends the report on its next link."""

# --------------------------------------------------------------------------- hello


async def open_link(
    ctx: HostContext, identity: RuntimeIdentity, protocol_revision: int
) -> tuple[RuntimeLinkHandle, list[str]]:
    """Register a runtime after its hello.

    Returns:
        The link handle and the registered agent targets Host will route to it.

    Raises:
        FailedPrecondition: ``RUNTIME_PROTOCOL_MISMATCH``.
    """
    if protocol_revision != PROTOCOL_REVISION:
        raise FailedPrecondition(
            f"runtime link revision {protocol_revision} is not supported "
            f"(this Host speaks {PROTOCOL_REVISION})",
            reason="RUNTIME_PROTOCOL_MISMATCH",
            metadata={"supported": str(PROTOCOL_REVISION)},
        )
    handle = RuntimeLinkHandle(identity)
    replaced, dead_instance = ctx.runtimes.attach(handle)
    if replaced is not None:
        replaced.close()
    if ctx.presence is not None:
        # SCALE-2: the instance recorded on any replica tells a restart, not only this one's.
        try:
            recorded = await ctx.presence.attached(handle)
        except BaseException:
            if ctx.runtimes.detach(handle):
                handle.close()
            raise
        # The durable record is the one every replica updates; this process's memory of
        # the instance may predate a restart another replica has already handled.
        dead_instance = recorded if recorded not in (None, identity.instance_id) else None
    if dead_instance is not None:
        _log.info("runtime %s restarted (was %s)", identity.runtime_id, dead_instance)
        await runtime_lost(ctx, identity, include_served_by_others=True)

    async def targets(repos: HostTransaction) -> list[str]:
        rows = await repos.session_rows.targets_for_providers(
            identity.providers, identity.target_ids
        )
        return sorted({row.agent_target_id for row in rows})

    return handle, await ctx.transact(targets, write=False)


async def link_ready(ctx: HostContext, handle: RuntimeLinkHandle) -> None:
    """After the welcome: re-send every unacknowledged command this link should run.

    Then make every delivered answer still resolving in the Sessions it serves due for a
    disposition query, which the background querier sends: its disposition may have been lost
    with the previous link or Host (HOST-INT-6). That is one write, and its failure does not
    end the link: the durable schedule still queries the answers later.
    """
    await command_outbox.resend_unacknowledged(ctx, handle)
    try:
        await disposition_queries.make_due_after_reconnect(ctx, handle)
    except Exception:  # noqa: BLE001 - the schedule is durable; the link must not end here
        _log.warning("making disposition queries due after a reconnect failed", exc_info=True)


async def close_link(ctx: HostContext, handle: RuntimeLinkHandle) -> None:
    """The stream ended: start the loss grace unless a newer link took over."""
    handle.close()
    if not ctx.runtimes.detach(handle):
        return
    if ctx.presence is not None:
        await ctx.presence.detached(handle)
    start_loss_grace(ctx, handle.identity)


def start_loss_grace(ctx: HostContext, identity: RuntimeIdentity) -> None:
    """Settle the runtime's Turns unless it is attached again when the grace ends.

    With several replicas (SCALE-2) "attached again" means to any replica: a runtime that
    moved to another Host within the grace keeps its Turns. This is also how a live replica
    takes over the grace of a runtime whose replica died (``ReplicaPresence`` claims its row).
    """
    runtime_id = identity.runtime_id

    async def after_grace() -> None:
        try:
            await asyncio.sleep(ctx.runtime_loss_grace_seconds)
            if ctx.runtimes.is_connected(runtime_id):
                return
            if ctx.presence is not None and await ctx.presence.attached_anywhere(runtime_id):
                return
            await runtime_lost(ctx, identity, include_served_by_others=False)
        finally:
            ctx.runtimes.loss_done(runtime_id, asyncio.current_task())

    ctx.runtimes.schedule_loss(runtime_id, asyncio.create_task(after_grace()))


async def runtime_lost(
    ctx: HostContext, identity: RuntimeIdentity, *, include_served_by_others: bool
) -> int:
    """Confirm the runtime's provider sessions dead (HOST-INT-3, HOST-TURN-5).

    Returns:
        How many Sessions had an active Turn interrupted.
    """
    # SCALE-2: runtimes attached to other replicas serve Sessions too.
    elsewhere = []
    if ctx.presence is not None and not include_served_by_others:
        elsewhere = [
            other
            for other in await ctx.presence.identities()
            if other.runtime_id != identity.runtime_id
        ]

    def served_by_another(workspace_id: str, target_id: str | None, provider: str) -> bool:
        if ctx.runtimes.link_for(workspace_id, target_id, provider) is not None:
            return True
        return any(other.serves(workspace_id, target_id, provider) for other in elsewhere)

    async def candidates(repos: HostTransaction) -> list[tuple[str, str]]:
        rows = await repos.session_rows.with_active_turns(identity.providers)
        return [
            (row.workspace_id, row.session_id)
            for row in rows
            if identity.serves(row.workspace_id, row.agent_target_id, row.provider)
            and (
                include_served_by_others
                or not served_by_another(row.workspace_id, row.agent_target_id, row.provider)
            )
        ]

    count = 0
    for workspace_id, session_id in await ctx.transact(candidates, write=False):

        async def interrupt(
            repos: HostTransaction, ws: str = workspace_id, sid: str = session_id
        ) -> bool:
            session = await repos.session_rows.lock_with_root(ws, sid)
            if session is None:
                return False
            return await _confirm_dead(repos, session, ctx.clock())

        async with ctx.lanes.hold(workspace_id, session_id):
            count += int(await ctx.transact(interrupt))
    return count


async def _confirm_dead(repos: HostTransaction, session: SessionRow, now: int) -> bool:
    """Interrupt the active Turn and supersede every open Interaction of the Session."""
    changed = False
    if session.active_turn_id is not None:
        turn = await repos.turns.get(
            session.workspace_id, session.session_id, session.active_turn_id
        )
        if turn is not None and lifecycle.is_active(turn):
            await lifecycle.settle(repos, session, turn, "interrupted", now)
            changed = True
    for row in await repos.interactions.open_for_session(session.workspace_id, session.session_id):
        turn = await repos.turns.get(row.workspace_id, row.session_id, row.turn_id)
        if turn is not None:
            await lifecycle.close_open_interactions(repos, turn, "superseded", now)
            changed = True
    return changed


# ---------------------------------------------------------------------------- acks


async def apply_ack(ctx: HostContext, handle: RuntimeLinkHandle, ack: CommandAck) -> None:
    """Record a command acknowledgement and wake whoever awaits it (here or elsewhere)."""
    await apply_acks(ctx, handle, [ack])


async def apply_acks(
    ctx: HostContext, handle: RuntimeLinkHandle, acks: Sequence[CommandAck]
) -> None:
    """Record acknowledgements in one transaction, in order, then wake whoever awaits them."""
    outcomes = await command_outbox.record_acks(ctx, acks)
    for ack, outcome in zip(acks, outcomes, strict=True):
        handle.resolve_ack(ack)
        if ctx.command_wakeups is not None and outcome.found:
            await ctx.command_wakeups.acknowledged(ack, outcome.kind)


# ------------------------------------------------------------------------- reports


class _Refused(Exception):
    def __init__(self, verdict: ReportVerdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict


class _Progress:
    """The index of the item being applied, for a refusal raised by the store."""

    index = 0


async def apply_report(
    ctx: HostContext, identity: RuntimeIdentity, report: RuntimeReportInput
) -> ReportVerdict:
    """Apply one report atomically with the causal write barrier.

    A report whose content cannot be applied is a ``rejected`` verdict (nothing commits,
    the link stays up): an invalid value, a tombstoned or fenced Session, a refused item,
    a domain rule it breaks, or a value or constraint the store refuses (SEC-4).

    Raises:
        PermissionDenied: ``WORKSPACE_SCOPE_MISMATCH`` (the report names a workspace
            outside the runtime's token; the link is closed).
        Unavailable: ``STORE_BUSY`` (nothing committed; the runtime re-sends the report).
        Aborted: ``STORE_CONFLICT`` (likewise).
    """
    if not identity.may_access(report.workspace_id):
        raise PermissionDenied(
            f"runtime {identity.runtime_id} may not report for workspace {report.workspace_id!r}",
            reason="WORKSPACE_SCOPE_MISMATCH",
            metadata={"workspace_id": report.workspace_id},
        )
    if report.invalid_fields:
        return _invalid_values(report)
    progress = _Progress()
    try:
        async with ctx.lanes.hold_for_report(report.workspace_id, report.session_id):
            return await ctx.transact(lambda repos: _apply(ctx, repos, report, progress))
    except _Refused as refused:
        return refused.verdict
    except (IntegrityError, DataError) as error:
        refusal = store_refusal(error)
        assert refusal is not None
        _log.warning(
            "report %s for %s/%s rejected: the store refused item %d (%s)",
            report.report_id,
            report.workspace_id,
            report.session_id,
            progress.index,
            refusal.message,
        )
        return _rejected_at(report, progress.index, refusal)
    except _REJECTING_ERRORS as error:
        return _rejected_at(report, progress.index, error)


def _invalid_values(report: RuntimeReportInput) -> ReportVerdict:
    by_item: dict[int, list[InvalidField]] = {}
    for invalid in report.invalid_fields:
        by_item.setdefault(invalid.index, []).append(invalid)
    results = tuple(
        ItemResult(
            index,
            "rejected",
            message="; ".join(f"{f.field}: {f.description}" for f in fields),
        )
        for index, fields in sorted(by_item.items())
    )
    return ReportVerdict(report.report_id, "rejected", results, INVALID_FIELD_VALUE)


def _rejected_at(report: RuntimeReportInput, index: int, error: DomainError) -> ReportVerdict:
    result = ItemResult(index, "rejected", message=error.message)
    return ReportVerdict(report.report_id, "rejected", (result,), error.reason)


def _reject_all(report: RuntimeReportInput, reason: str, message: str) -> _Refused:
    """Every item rejected with one reason: the report is about a Session it may not touch."""
    results = tuple(
        ItemResult(index, "rejected", message=message) for index in range(len(report.items))
    )
    return _Refused(ReportVerdict(report.report_id, "rejected", results, reason))


async def _frozen(
    repos: HostTransaction, report: RuntimeReportInput, session: SessionRow | None
) -> _Refused | None:
    """The refusal of a report about a tombstone or a fenced id, if it is one.

    A tombstone is frozen (HOST-DEL-3): no title, cwd, usage, target, resume identity, Turn,
    message or Interaction of it changes until it is restored. A missing id with a pending
    resource-cleanup row anywhere is fenced (HOST-DEL-11), checked with the query
    ``CreateSession`` uses, so no report re-creates a purged Session before its cleanup.
    """
    if session is not None:
        if session.deleted_at_unix_ms is None:
            return None
        return _reject_all(
            report,
            SESSION_DELETED,
            f"Session {report.session_id!r} is deleted; a tombstone takes no reports",
        )
    if await repos.session_rows.cleanup_pending(report.session_id):
        return _reject_all(
            report,
            SESSION_PURGED,
            f"Session id {report.session_id!r} was purged and is fenced by a pending "
            "resource cleanup",
        )
    return None


async def _apply(
    ctx: HostContext,
    repos: HostTransaction,
    report: RuntimeReportInput,
    progress: _Progress,
) -> ReportVerdict:
    now = ctx.clock()
    session = await repos.session_rows.lock_with_root(report.workspace_id, report.session_id)
    frozen = await _frozen(repos, report, session)
    if frozen is not None:
        raise frozen
    results: dict[int, ItemResult] = {}
    items = list(enumerate(report.items))

    def refuse(index: int, outcome: str, reason: str, message: str) -> _Refused:
        result = ItemResult(index, outcome, message=message)
        return _Refused(ReportVerdict(report.report_id, outcome, (result,), reason))

    for index, item in items:
        if index in results:
            continue  # a message already flushed ahead of its Turn's terminal patch
        progress.index = index
        if item is None:
            raise refuse(index, "rejected", "EMPTY_ITEM", "report item has no payload")
        if isinstance(item, SessionPatchItem):
            session, changed = await _apply_session_patch(
                repos, report, session, index, item, now, refuse
            )
            results[index] = ItemResult(index, "applied" if changed else "already_applied")
        elif session is None:
            raise refuse(index, "rejected", "UNKNOWN_SESSION", "report names an unknown Session")
        else:
            if isinstance(item, TurnPatchItem) and item.terminal:
                # The barrier: this Turn's messages commit before its terminal state.
                await _apply_turn_messages(
                    repos, session, items, index, item.turn_id, results, progress, now, refuse
                )
            results[index] = await _apply_item(ctx, repos, session, index, item, now, refuse)
        # Written now, so a store refusal is charged to the item that caused it.
        await repos.session_rows.flush()
    ordered = tuple(results[index] for index in sorted(results))
    applied = any(result.outcome == "applied" for result in ordered)
    return ReportVerdict(report.report_id, "applied" if applied else "already_applied", ordered)


Refuse = Callable[[int, str, str, str], _Refused]

_SessionItem = (
    TurnPatchItem | TransitionInput | MessageSnapshotItem | DispositionInput | SessionLostItem
)
"""A report item that needs its Session to exist."""


async def _apply_turn_messages(
    repos: HostTransaction,
    session: SessionRow,
    items: list[tuple[int, ReportItem | None]],
    index: int,
    turn_id: str,
    results: dict[int, ItemResult],
    progress: _Progress,
    now: int,
    refuse: Refuse,
) -> None:
    """Apply the report's later message snapshots of ``turn_id`` ahead of its terminal patch."""
    for later, other in items[index + 1 :]:
        if (
            isinstance(other, MessageSnapshotItem)
            and other.turn_id == turn_id
            and later not in results
        ):
            progress.index = later
            results[later] = await _apply_message(repos, session, later, other, now, refuse)
            progress.index = index


async def _apply_item(
    ctx: HostContext,
    repos: HostTransaction,
    session: SessionRow,
    index: int,
    item: _SessionItem,
    now: int,
    refuse: Refuse,
) -> ItemResult:
    """Apply one item of an existing Session."""
    if isinstance(item, TurnPatchItem):
        return await _apply_turn_patch(repos, session, index, item, now, refuse)
    if isinstance(item, MessageSnapshotItem):
        return await _apply_message(repos, session, index, item, now, refuse)
    if isinstance(item, TransitionInput):
        return await _apply_transition(repos, session, index, item, now, refuse)
    if isinstance(item, DispositionInput):
        outcome = await interactions.apply_disposition(repos, ctx, session, item, now)
        if outcome.outcome == "rejected":
            raise refuse(index, "rejected", "UNKNOWN_OPERATION", outcome.detail or "")
        return ItemResult(index, outcome.outcome, outcome.stale)
    changed = await _confirm_dead(repos, session, now)
    return ItemResult(index, "applied" if changed else "already_applied")


async def _apply_session_patch(
    repos: HostTransaction,
    report: RuntimeReportInput,
    session: SessionRow | None,
    index: int,
    item: SessionPatchItem,
    now: int,
    refuse: Refuse,
) -> tuple[SessionRow, bool]:
    # HOST-SES-1: a patch that omits the target, or names it empty, never clears it.
    target_id = item.agent_target_id or None
    if session is None:
        child = await _create_child(repos, report, index, item, target_id, now, refuse)
        return child, True
    if target_id is not None and target_id != session.agent_target_id:
        await _check_target(repos, report, index, target_id, session.provider, refuse)
    values = _patch_values(session, item, target_id)
    changed = any(getattr(session, name) != value for name, value in values.items())
    if changed:
        values["updated_at_unix_ms"] = max(session.updated_at_unix_ms, now)
        repos.session_rows.update(session, **values)
    return session, changed


async def _create_child(
    repos: HostTransaction,
    report: RuntimeReportInput,
    index: int,
    item: SessionPatchItem,
    target_id: str | None,
    now: int,
    refuse: Refuse,
) -> SessionRow:
    """Create the child Session a patch of an unknown id announces, from its live parent."""
    if item.parent_session_id is None:
        raise refuse(index, "rejected", "UNKNOWN_SESSION", "report names an unknown Session")
    # Locked: a concurrent delete of the parent either sees this child (its plan goes
    # stale) or has tombstoned the parent, and no live child is put under a tombstone.
    # The child's own id passed the purge fence in ``_frozen`` (HOST-DEL-11).
    parent = await repos.session_rows.get(report.workspace_id, item.parent_session_id, lock=True)
    if parent is None or parent.deleted_at_unix_ms is not None:
        raise refuse(index, "rejected", "UNKNOWN_SESSION", "parent Session not found")
    if target_id is not None:
        await _check_target(repos, report, index, target_id, parent.provider, refuse)
    session = repos.session_rows.add(
        workspace_id=report.workspace_id,
        session_id=report.session_id,
        parent_session_id=parent.session_id,
        root_session_id=parent.root_session_id,
        parent_turn_id=item.parent_turn_id,
        agent_target_id=target_id or parent.agent_target_id,
        provider=parent.provider,
        title=item.title or "",
        cwd=item.cwd if item.cwd is not None else parent.cwd,
        rail_section_key=parent.rail_section_key,
        rail_project_path=parent.rail_project_path,
        settings_json=parent.settings_json,
        capabilities_json=parent.capabilities_json,
        usage_json=item.usage_json,
        message_version=0,
        next_message_sequence=1,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
    )
    await repos.session_rows.flush()
    return session


def _patch_values(
    session: SessionRow, item: SessionPatchItem, target_id: str | None
) -> dict[str, object]:
    """The Session columns the patch carries (``target_id`` is its non-empty target, if any)."""
    values: dict[str, object] = {}
    if item.title is not None:
        values["title"] = item.title
    if item.cwd is not None:
        values["cwd"] = item.cwd  # never changes rail_section_key (HOST-SES-2)
    if item.usage_json is not None:
        values["usage_json"] = item.usage_json
    if target_id is not None:
        values["agent_target_id"] = target_id
    if item.provider_session_ref is not None or item.runtime_context_json is not None:
        resume = json_object(session.provider_resume_json)
        if item.provider_session_ref is not None:
            resume["providerSessionRef"] = item.provider_session_ref
        if item.runtime_context_json is not None:
            resume["runtimeContextJson"] = item.runtime_context_json
        values["provider_resume_json"] = json.dumps(resume, sort_keys=True)
    return values


async def _check_target(
    repos: HostTransaction,
    report: RuntimeReportInput,
    index: int,
    target_id: str,
    provider: str,
    refuse: Refuse,
) -> None:
    """A reported target must be registered and of the Session's provider (HOST-SES-1)."""
    target = await repos.session_rows.target(report.workspace_id, target_id)
    if target is None:
        raise refuse(
            index,
            "rejected",
            UNKNOWN_AGENT_TARGET,
            f"agent target {target_id!r} is not registered",
        )
    if target.provider != provider:
        raise refuse(
            index,
            "rejected",
            AGENT_TARGET_PROVIDER_MISMATCH,
            f"agent target {target_id!r} is of provider {target.provider!r}, "
            f"the Session's is {provider!r}",
        )


async def _apply_turn_patch(
    repos: HostTransaction,
    session: SessionRow,
    index: int,
    item: TurnPatchItem,
    now: int,
    refuse: Refuse,
) -> ItemResult:
    if item.phase is None:
        raise refuse(index, "rejected", "INVALID_TURN_PATCH", "phase is required")
    if item.terminal and item.outcome is None:
        raise refuse(index, "rejected", "INVALID_TURN_PATCH", "a settlement needs an outcome")
    snapshot: str | None = None
    if item.file_changes is not None:
        if (problem := file_changes_violation(item.file_changes)) is not None:
            raise refuse(index, "rejected", "INVALID_TURN_PATCH", problem)
        snapshot = encode_file_changes(item.file_changes)
    turn = await repos.turns.get(session.workspace_id, session.session_id, item.turn_id)
    if turn is None:
        if item.origin is None:
            raise refuse(
                index, "rejected", "INVALID_TURN_PATCH", "origin is required to create a Turn"
            )
        turn = repos.turns.add(
            workspace_id=session.workspace_id,
            session_id=session.session_id,
            turn_id=item.turn_id,
            phase="queued" if item.terminal else item.phase,
            outcome=None,
            origin=item.origin,
            root_turn_id=item.root_turn_id,
            version=1,
            created_at_unix_ms=now,
            updated_at_unix_ms=now,
            started_at_unix_ms=None if item.phase == "queued" else now,
            file_changes_json=snapshot,
        )
        await repos.turns.flush()
        if not item.terminal and session.active_turn_id is None:
            repos.session_rows.update(
                session,
                active_turn_id=turn.turn_id,
                updated_at_unix_ms=max(session.updated_at_unix_ms, now),
            )
        if not item.terminal:
            return ItemResult(index, "applied")
        snapshot = None  # stored with the new row
    # HOST-TURN-8: the snapshot replaces the stored one until the Turn settles, then it is
    # frozen like the result; a settling patch's own snapshot is stored before it settles.
    replaced = snapshot is not None and turn.phase != "settled"
    if replaced and snapshot != turn.file_changes_json:
        repos.turns.update(
            turn, file_changes_json=snapshot, version=turn.version + 1, updated_at_unix_ms=now
        )
    else:
        replaced = False
    if item.terminal:
        assert item.outcome is not None
        # A root Turn with active children records the patch and settles after them.
        change = await lifecycle.settle_when_children_done(
            repos, session, turn, item.outcome, now, failure_message=item.failure_message
        )
    else:
        change = lifecycle.advance_phase(repos, turn, item.phase, now)
    changed = change.changed or replaced
    return ItemResult(index, "applied" if changed else "already_applied", change.stale)


async def _apply_message(
    repos: HostTransaction,
    session: SessionRow,
    index: int,
    item: MessageSnapshotItem,
    now: int,
    refuse: Refuse,
) -> ItemResult:
    if item.role is None or item.kind is None or not item.message_id:
        raise refuse(index, "rejected", INVALID_MESSAGE, "message id, role and kind are required")
    if item.user_visible_assistant_response is None:
        # HOST-MSG-1: the producer classifies; Host never derives it from role or kind.
        raise refuse(
            index,
            "rejected",
            INVALID_MESSAGE,
            "user_visible_assistant_response is required (the runtime classifies its messages)",
        )
    await _check_message_turn(repos, session, index, item, refuse)
    if item.tool_call is not None:
        # HOST-MSG-3..5: projection and budgets; data that cannot fit rejects the report.
        try:
            payload = build_tool_call_payload(item.tool_call).payload_json
        except (InvalidArgument, ResourceExhausted) as error:
            raise refuse(index, "rejected", error.reason, error.message) from error
    else:
        payload = item.payload_json or "{}"
    write = await messages.write_snapshot(
        repos,
        session,
        message_id=item.message_id,
        turn_id=item.turn_id,
        role=item.role,
        kind=item.kind,
        payload_json=payload,
        user_visible_assistant_response=item.user_visible_assistant_response,
        occurred_at_unix_ms=item.occurred_at_unix_ms or now,
        now=now,
    )
    return ItemResult(index, "applied" if write.changed else "already_applied")


async def _check_message_turn(
    repos: HostTransaction,
    session: SessionRow,
    index: int,
    item: MessageSnapshotItem,
    refuse: Refuse,
) -> None:
    """HOST-MSG-7: an execution message names an existing Turn of its Session.

    Only a ``notice`` may be Session-scoped (no ``turn_id``); a ``turn_id`` that is given
    must name a Turn of this Session, whatever the kind.
    """
    if item.turn_id is None:
        if item.kind != SESSION_SCOPED_KIND:
            raise refuse(
                index,
                "rejected",
                INVALID_MESSAGE,
                f"a {item.kind} message needs the turn_id of its Turn; only a notice may "
                "be Session-scoped",
            )
        return
    turn = await repos.turns.get(session.workspace_id, session.session_id, item.turn_id)
    if turn is None:
        raise refuse(
            index,
            "rejected",
            INVALID_MESSAGE,
            f"message names Turn {item.turn_id!r}, which is not a Turn of this Session",
        )


async def _apply_transition(
    repos: HostTransaction,
    session: SessionRow,
    index: int,
    item: TransitionInput,
    now: int,
    refuse: Refuse,
) -> ItemResult:
    if item.status not in interactions.REPORTABLE:
        raise refuse(
            index,
            "rejected",
            "STATUS_NOT_REPORTABLE",
            "runtime reports may submit only pending and superseded",
        )
    if not item.kind or not item.request_id:
        raise refuse(index, "rejected", "INVALID_INTERACTION", "kind and request_id are required")
    turn = await repos.turns.get(session.workspace_id, session.session_id, item.turn_id)
    if turn is None:
        raise refuse(
            index, "rejected", "UNKNOWN_TURN", f"Interaction names unknown Turn {item.turn_id!r}"
        )
    outcome = await interactions.persist_transition(repos, session, item, now)
    if outcome.outcome == "conflict":
        raise refuse(index, "conflict", "INTERACTION_CONFLICT", outcome.detail or "conflict")
    return ItemResult(index, outcome.outcome, outcome.stale)


__all__ = [
    "MAX_REPORT_BYTES",
    "ReportItem",
    "apply_ack",
    "apply_report",
    "close_link",
    "link_ready",
    "open_link",
    "runtime_lost",
    "start_loss_grace",
]
