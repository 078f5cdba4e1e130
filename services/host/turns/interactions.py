"""Interactions: runtime transitions, the durable response operation, attention (HOST-INT-*).

Status model (ADR 0013): ``pending -> resolving -> answered | superseded | interrupted`` and
``pending -> superseded | interrupted``. A terminal status never changes again and nothing
returns to ``pending``. A user response claims the Interaction (``pending -> resolving``,
the provisional ``answered`` claim and the answer stored) in one transaction with its
durable operation and the outbox command; the runtime's disposition completes both.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass

from domainerrors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
)
from services.host.context import HostContext
from services.host.model.records import InteractionRecord, SessionRecord
from services.host.repository.row_records import (
    OperationRecord,
    interaction_record,
    operation_record,
)
from services.host.repository.row_views import InteractionRow, OperationRow, SessionRow
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.commands import DeliverInteractionResponse
from services.host.turns import command_outbox, response_followers

TERMINAL = frozenset({"answered", "superseded", "interrupted"})
REPORTABLE = frozenset({"pending", "superseded"})
"""The only statuses a runtime report may submit (HOST-INT-1)."""
MAX_WAIT_MS = 30_000


@dataclass(frozen=True)
class TransitionInput:
    """A runtime's Interaction transition (the immutable identity plus presentation)."""

    turn_id: str
    request_id: str
    status: str
    kind: str
    tool_name: str | None
    input_json: str
    metadata_json: str
    title: str
    summary: str
    options_json: str | None
    occurred_at_unix_ms: int


@dataclass(frozen=True)
class TransitionOutcome:
    """``applied`` | ``already_applied`` | ``conflict``, and whether it was a stale replay."""

    outcome: str
    stale: bool = False
    detail: str | None = None


def _conflict(row: InteractionRow, item: TransitionInput) -> str | None:
    for name, stored, reported in (
        ("kind", row.kind, item.kind),
        ("tool_name", row.tool_name, item.tool_name),
        ("input", row.input_json or "", item.input_json),
        ("metadata", row.metadata_json or "", item.metadata_json),
    ):
        if stored != reported:
            return f"{name} changed"
    return None


async def persist_transition(
    repos: HostTransaction, session: SessionRow, item: TransitionInput, now: int
) -> TransitionOutcome:
    """Persist one runtime transition by the full tuple (HOST-INT-2).

    The caller has checked ``item.status`` is reportable and that the Turn exists.
    """
    ws, sid = session.workspace_id, session.session_id
    turn = await repos.turns.get(ws, sid, item.turn_id)
    assert turn is not None  # checked by the caller
    row = await repos.interactions.get(ws, sid, item.turn_id, item.request_id)
    if row is not None:
        conflict = _conflict(row, item)
        if conflict is not None:
            return TransitionOutcome("conflict", detail=conflict)
        if row.status in TERMINAL or row.status == item.status:
            return TransitionOutcome("already_applied", stale=row.status != item.status)
        if item.status == "pending":
            # resolving -> pending would hand a claimed Interaction back: never.
            return TransitionOutcome("already_applied", stale=True)
        repos.interactions.update(
            row, status=item.status, version=row.version + 1, updated_at_unix_ms=now
        )
        await _complete_operations(repos, row, item.status, now, detail="superseded by runtime")
        return TransitionOutcome("applied")
    stale = turn.phase == "settled" and item.status == "pending"
    repos.interactions.add(
        workspace_id=ws,
        session_id=sid,
        turn_id=item.turn_id,
        request_id=item.request_id,
        kind=item.kind,
        # A settled Turn cannot acquire a pending Interaction: the late report is kept
        # as evidence, already superseded and never actionable.
        status="superseded" if stale else item.status,
        tool_name=item.tool_name,
        input_json=item.input_json,
        metadata_json=item.metadata_json,
        title=item.title,
        summary=item.summary,
        options_json=item.options_json,
        actionable=not stale and item.status == "pending",
        version=1,
        occurred_at_unix_ms=item.occurred_at_unix_ms or now,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
    )
    return TransitionOutcome("applied", stale=stale)


async def _complete_operations(
    repos: HostTransaction, row: InteractionRow, disposition: str, now: int, *, detail: str
) -> None:
    await response_followers.complete_open_operations(repos, row, disposition, now, detail=detail)


# ------------------------------------------------------------------ response operation


@dataclass(frozen=True)
class ResponseRequest:
    """A validated ``SubmitInteractionResponse``."""

    workspace_id: str
    session_id: str
    turn_id: str
    request_id: str
    action: str
    option_id: str | None
    payload_json: str | None
    idempotency_key: str
    wait_timeout_ms: int = 0

    def fingerprint(self) -> str:
        """Digest of the tuple and the answer: what an identical replay must match."""
        body = [
            self.session_id,
            self.turn_id,
            self.request_id,
            self.action,
            self.option_id,
            self.payload_json,
        ]
        return hashlib.sha256(json.dumps(body).encode()).hexdigest()


@dataclass(frozen=True)
class OperationView:
    """An operation with its Interaction's current state."""

    operation: OperationRecord
    interaction: InteractionRecord | None
    replayed: bool = False


def validate_response(request: ResponseRequest) -> None:
    """Reject malformed responses (SEC-2)."""
    violations = [
        FieldViolation(name, "is required")
        for name, value in (
            ("session_id", request.session_id),
            ("turn_id", request.turn_id),
            ("request_id", request.request_id),
            ("action", request.action),
            ("idempotency_key", request.idempotency_key),
        )
        if not value
    ]
    if request.payload_json is not None:
        try:
            json.loads(request.payload_json)
        except (ValueError, RecursionError):  # RecursionError: nested too deep (SEC-4)
            violations.append(FieldViolation("payload_json", "must be a JSON value"))
    if request.wait_timeout_ms < 0:
        violations.append(FieldViolation("wait_timeout_ms", "must not be negative"))
    if violations:
        raise InvalidArgument(
            f"invalid response: {violations[0].field} {violations[0].description}",
            field_violations=violations,
        )


async def submit_response(ctx: HostContext, request: ResponseRequest) -> OperationView:
    """Create (or replay) the durable response operation (HOST-INT-3).

    Raises:
        NotFound: ``INTERACTION_NOT_FOUND``.
        AlreadyExists: ``IDEMPOTENCY_KEY_CONFLICT`` (changed or partial replay).
        FailedPrecondition: ``INTERACTION_NOT_ACTIONABLE``.
    """
    validate_response(request)

    async def run(repos: HostTransaction) -> tuple[str, bool]:
        earlier = await repos.operations.by_key(request.workspace_id, request.idempotency_key)
        if earlier is not None:
            if earlier.request_fingerprint != request.fingerprint():
                raise AlreadyExists(
                    "idempotency_key was used for a different response",
                    reason="IDEMPOTENCY_KEY_CONFLICT",
                    metadata={"operation_id": earlier.operation_id},
                )
            return earlier.operation_id, True
        session, row, leader = await _claimable(repos, request)
        if leader is not None:
            return _record_follower(ctx, repos, leader, request), False
        return _record_response(ctx, repos, session, row, request), False

    operation_id, replayed = await ctx.transact(run)
    view = await get_operation(ctx, request.workspace_id, operation_id)
    deadline = time.monotonic() + min(request.wait_timeout_ms, MAX_WAIT_MS) / 1000
    while view.operation.state != "completed" and time.monotonic() < deadline:
        # A cancelled wait (the caller going away) only stops this loop; the operation
        # itself is durable and keeps going (HOST-INT-3).
        await asyncio.sleep(0.05)
        view = await get_operation(ctx, request.workspace_id, operation_id)
    return OperationView(view.operation, view.interaction, replayed)


async def _claimable(
    repos: HostTransaction, request: ResponseRequest
) -> tuple[SessionRow, InteractionRow, OperationRow | None]:
    """The locked Session, the Interaction the response answers, and its claimant if any.

    With no claimant the Interaction is pending and actionable, and the response claims it;
    with one, the response follows it (HOST-INT-5), whatever the Interaction's status now.

    Raises:
        NotFound: ``INTERACTION_NOT_FOUND``.
        FailedPrecondition: ``INTERACTION_NOT_ACTIONABLE`` (unclaimed and no longer pending:
            runtime-terminal, or its Turn settled).
    """
    ws = request.workspace_id
    session = await repos.session_rows.get(ws, request.session_id, lock=True)
    row = await repos.interactions.get(ws, request.session_id, request.turn_id, request.request_id)
    if session is None or row is None:
        raise NotFound("Interaction not found", reason="INTERACTION_NOT_FOUND")
    leader = await response_followers.claimant(repos, row)
    if leader is not None:
        return session, row, leader
    turn = await repos.turns.get(ws, request.session_id, request.turn_id)
    if row.status != "pending" or not row.actionable or turn is None or turn.phase == "settled":
        raise FailedPrecondition(
            f"Interaction is {row.status}, not actionable",
            reason="INTERACTION_NOT_ACTIONABLE",
            metadata={"status": row.status},
        )
    return session, row, None


def _new_operation(
    repos: HostTransaction, request: ResponseRequest, now: int, **state: object
) -> str:
    """Add the response's operation row (``state``: its state columns); returns its id."""
    operation_id = f"op-{uuid.uuid4()}"
    repos.operations.add(
        workspace_id=request.workspace_id,
        operation_id=operation_id,
        idempotency_key=request.idempotency_key,
        session_id=request.session_id,
        turn_id=request.turn_id,
        request_id=request.request_id,
        request_fingerprint=request.fingerprint(),
        action=request.action,
        option_id=request.option_id,
        answer_json=request.payload_json,
        attempts=0,
        created_at_unix_ms=now,
        updated_at_unix_ms=now,
        **state,
    )
    return operation_id


def _record_follower(
    ctx: HostContext, repos: HostTransaction, leader: OperationRow, request: ResponseRequest
) -> str:
    """Add a competing responder's operation: never dispatched, it follows ``leader``.

    The Interaction and its claim are left as they are (HOST-INT-5).
    """
    answer = response_followers.Answer(request.action, request.option_id, request.payload_json)
    disposition = response_followers.follower_disposition(answer, leader)
    now = ctx.clock()
    if disposition is None:
        return _new_operation(repos, request, now, state="resolving")
    return _new_operation(
        repos,
        request,
        now,
        state="completed",
        disposition=disposition,
        completed_at_unix_ms=now,
        last_error=f"follows {leader.operation_id}",
    )


def _record_response(
    ctx: HostContext,
    repos: HostTransaction,
    session: SessionRow,
    row: InteractionRow,
    request: ResponseRequest,
) -> str:
    """Add the operation, mark the Interaction ``resolving`` and queue the delivery command."""
    now = ctx.clock()
    operation_id = _new_operation(repos, request, now, state="pending")
    answer = {
        "action": request.action,
        "option_id": request.option_id,
        "payload_json": request.payload_json,
        "answered_at_unix_ms": now,
        "claim": "answered",
        response_followers.CLAIMANT_KEY: operation_id,
    }
    repos.interactions.update(
        row,
        status="resolving",
        answer_json=json.dumps(answer),
        version=row.version + 1,
        updated_at_unix_ms=now,
    )
    command = DeliverInteractionResponse(
        operation_id=operation_id,
        turn_id=request.turn_id,
        request_id=request.request_id,
        action=request.action,
        option_id=request.option_id,
        payload_json=request.payload_json,
    )
    command_outbox.enqueue(repos, ctx, session, command, operation_id=operation_id)
    return operation_id


async def get_operation(ctx: HostContext, workspace_id: str, operation_id: str) -> OperationView:
    """Read an operation and its Interaction.

    Raises:
        NotFound: ``OPERATION_NOT_FOUND``.
    """

    async def run(repos: HostTransaction) -> OperationView:
        operation = await repos.operations.get(workspace_id, operation_id)
        if operation is None:
            raise NotFound(f"operation {operation_id!r} not found", reason="OPERATION_NOT_FOUND")
        interaction = await repos.interactions.get(
            workspace_id, operation.session_id, operation.turn_id, operation.request_id
        )
        return OperationView(
            operation_record(operation),
            None if interaction is None else interaction_record(interaction),
        )

    return await ctx.transact(run, write=False)


@dataclass(frozen=True)
class DispositionInput:
    """The runtime's disposition of a delivered response."""

    operation_id: str
    command_id: str
    turn_id: str
    request_id: str
    disposition: str
    detail: str | None


async def apply_disposition(
    repos: HostTransaction, ctx: HostContext, session: SessionRow, item: DispositionInput, now: int
) -> TransitionOutcome:
    """Record the runtime's disposition of an Interaction operation (HOST-INT-3, HOST-INT-6).

    The disposition answers the delivery or a disposition query. ``pending`` releases the
    claim and re-dispatches the same answer under a new command; ``resolving`` and an unknown
    record (no disposition) keep waiting; a terminal status completes the operation and the
    operations that follow it (HOST-INT-5).
    """
    operation = await repos.operations.get(session.workspace_id, item.operation_id)
    if (
        operation is None
        or operation.session_id != session.session_id
        or operation.turn_id != item.turn_id
        or operation.request_id != item.request_id
    ):
        return TransitionOutcome("rejected", detail="disposition for an unknown operation tuple")
    interaction = await repos.interactions.get(
        session.workspace_id, session.session_id, item.turn_id, item.request_id
    )
    leader_id = None if interaction is None else response_followers.claimant_id(interaction)
    if leader_id is not None and leader_id != operation.operation_id:
        # A follower was never sent to the runtime, so no runtime can dispose of it.
        return TransitionOutcome("rejected", detail="disposition for an undispatched operation")
    if operation.state == "completed":
        same = operation.disposition == item.disposition
        return TransitionOutcome("already_applied", stale=not same)
    if item.disposition in ("resolving", ""):
        # Still resolving, or the runtime has no record of it: only authoritative answers
        # end the wait; the next disposition query is already scheduled (HOST-INT-6).
        values: dict[str, object] = {"state": "resolving", "updated_at_unix_ms": now}
        if item.disposition == "":
            values["last_error"] = item.detail or "the runtime has no record of the request"
        changed = operation.state != "resolving"
        repos.operations.update(operation, **values)
        return TransitionOutcome("applied" if changed else "already_applied")
    if item.disposition == "pending":
        await _redeliver(repos, ctx, session, operation, item, now)
        return TransitionOutcome("applied")
    repos.operations.update(
        operation,
        state="completed",
        disposition=item.disposition,
        completed_at_unix_ms=now,
        updated_at_unix_ms=now,
        last_error=item.detail,
    )
    # Nothing is left to ask: an open query's acknowledgement then finds no row (ignored).
    for row in await repos.commands.of_operation(
        session.workspace_id, session.session_id, operation.operation_id, command_outbox.QUERY
    ):
        await repos.commands.delete(row)
    if interaction is not None:
        if interaction.status not in TERMINAL:
            repos.interactions.update(
                interaction,
                status=item.disposition,
                version=interaction.version + 1,
                updated_at_unix_ms=now,
            )
        # The followers: completed with the claimant, in its transaction.
        await response_followers.complete_open_operations(repos, interaction, item.disposition, now)
    return TransitionOutcome("applied")


async def _redeliver(
    repos: HostTransaction,
    ctx: HostContext,
    session: SessionRow,
    operation: OperationRow,
    item: DispositionInput,
    now: int,
) -> None:
    """The provider still waits for an answer: release the claim and send the same answer.

    The Interaction stays claimed (it never returns to pending); the operation goes back to
    ``pending`` and a new delivery command carries the stored answer, so a runtime that
    deduplicates by ``command_id`` still receives it. Earlier deliveries and queries of the
    operation leave the outbox: the new command replaces them.
    """
    ws, sid = session.workspace_id, session.session_id
    for kind in (command_outbox.DELIVER, command_outbox.QUERY):
        for row in await repos.commands.of_operation(ws, sid, operation.operation_id, kind):
            await repos.commands.delete(row)
    repos.operations.update(
        operation,
        state="pending",
        next_attempt_at_unix_ms=None,
        last_error=item.detail or "runtime reported pending",
        updated_at_unix_ms=now,
    )
    command = DeliverInteractionResponse(
        operation_id=operation.operation_id,
        turn_id=operation.turn_id,
        request_id=operation.request_id,
        action=operation.action,
        option_id=operation.option_id,
        payload_json=operation.answer_json,
    )
    command_outbox.enqueue(repos, ctx, session, command, operation_id=operation.operation_id)


# ------------------------------------------------------------------------ attention


@dataclass(frozen=True)
class AttentionEntry:
    """One actionable target (HOST-INT-4)."""

    interaction: InteractionRecord
    session: SessionRecord


async def list_attention(ctx: HostContext, workspace_id: str) -> list[AttentionEntry]:
    """Every actionable pending Interaction of the workspace, oldest first."""

    async def run(repos: HostTransaction) -> list[AttentionEntry]:
        rows = await repos.interactions.attention(workspace_id)
        return [AttentionEntry(interaction, session) for interaction, session in rows]

    return await ctx.transact(run, write=False)
