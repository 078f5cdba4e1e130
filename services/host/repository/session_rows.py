"""Session and agent-target rows as the activity lifecycle needs them (locks, counters)."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import bindparam, exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.changes import CREATED, RECONCILE, ActivityChanges, apply_fields
from services.host.repository.row_views import SessionRow, TargetRow
from store.models import DEPLOYMENT_WORKSPACE_KEY, AgentTarget, ResourceCleanupOutbox, Session

_LOCK_IF_ROOT: Final = (
    select(Session)
    .where(
        Session.workspace_id == bindparam("workspace_id"),
        Session.session_id == bindparam("session_id"),
        Session.root_session_id == Session.session_id,
    )
    .with_for_update()
    # A row read earlier in this transaction is refreshed with the values seen under the lock.
    .execution_options(populate_existing=True)
)


# Built once (compiled-statement cache): both run in every submit transaction.
_TARGET: Final = select(AgentTarget).where(
    AgentTarget.agent_target_id == bindparam("agent_target_id"),
    or_(
        AgentTarget.workspace_id == bindparam("workspace_id"),
        AgentTarget.workspace_id == DEPLOYMENT_WORKSPACE_KEY,
    ),
)
_CURSOR_STATE: Final = select(Session.active_turn_id, Session.message_version).where(
    Session.workspace_id == bindparam("workspace_id"),
    Session.session_id == bindparam("session_id"),
)


class SessionRowRepository:
    """Reads and locks Session rows; allocates message cursors."""

    def __init__(self, session: AsyncSession, changes: ActivityChanges) -> None:
        self._db = session
        self._changes = changes

    async def get(
        self, workspace_id: str, session_id: str, *, lock: bool = False
    ) -> SessionRow | None:
        """The live or deleted Session row; ``lock`` takes a row lock on Postgres.

        SQLite write transactions already hold the database write lock (``BEGIN IMMEDIATE``),
        so ``FOR UPDATE`` is only needed (and only emitted) on Postgres.
        """
        query = select(Session).where(
            Session.workspace_id == workspace_id, Session.session_id == session_id
        )
        if lock:
            # populate_existing: a row read earlier in this transaction is refreshed with
            # the values seen under the lock.
            query = query.with_for_update().execution_options(populate_existing=True)
        return (await self._db.execute(query)).scalar_one_or_none()

    async def lock_with_root(self, workspace_id: str, session_id: str) -> SessionRow | None:
        """Lock a Session row for a write that may settle Turns, its root Session's first.

        Settling a child Turn may settle the root Turn it works for (HOST-TURN-6), and
        stopping a root Turn settles its children: both lock root before child, so two
        such transactions never wait on each other in opposite order on Postgres.
        """
        # A root Session (the usual case) is locked by its first read: the statement locks
        # the row only when it is its own root, so a child is never locked before its root.
        params = {"workspace_id": workspace_id, "session_id": session_id}
        root = (await self._db.execute(_LOCK_IF_ROOT, params)).scalar_one_or_none()
        if root is not None:
            return root
        row = await self.get(workspace_id, session_id)
        if row is None:
            return None
        if row.root_session_id != row.session_id:
            # root_session_id never changes, so reading it without the lock is safe.
            await self.get(workspace_id, row.root_session_id, lock=True)
        return await self.get(workspace_id, session_id, lock=True)

    async def cursor_state(
        self, workspace_id: str, session_id: str
    ) -> tuple[str | None, int] | None:
        """The Session's active Turn id and message version (``None`` when it does not exist)."""
        params = {"workspace_id": workspace_id, "session_id": session_id}
        row = (await self._db.execute(_CURSOR_STATE, params)).one_or_none()
        return None if row is None else (row[0], int(row[1]))

    def request_reconcile(self, workspace_id: str, session_id: str) -> None:
        """Have the outbox write ``session_reconcile_required`` for this Session (HOST-RT-2)."""
        self._changes.session(workspace_id, session_id, (RECONCILE,))

    def add(self, **values: Any) -> SessionRow:
        """Stage a new Session row (a child Session a runtime reports, HOST-RT-3)."""
        row = Session(**values)
        self._db.add(row)
        self._changes.session(row.workspace_id, row.session_id, (CREATED,))
        return row

    def update(self, row: SessionRow, **values: object) -> None:
        """Change columns of a Session row (the changed names recorded for the outbox)."""
        changed = apply_fields(row, values)
        if changed:
            self._changes.session(row.workspace_id, row.session_id, changed)

    async def flush(self) -> None:
        """Write staged rows now."""
        await self._db.flush()

    async def target(self, workspace_id: str, agent_target_id: str) -> TargetRow | None:
        """The Session's agent target: workspace-private first, else deployment-wide."""
        params = {"workspace_id": workspace_id, "agent_target_id": agent_target_id}
        rows = (await self._db.execute(_TARGET, params)).scalars().all()
        rows = sorted(rows, key=lambda row: row.workspace_id == DEPLOYMENT_WORKSPACE_KEY)
        return rows[0] if rows else None

    async def cleanup_pending(self, session_id: str) -> bool:
        """Whether a pending resource-cleanup row fences this id in any workspace (HOST-DEL-11).

        The same query ``CreateSession`` refuses a fenced id by; a runtime report that would
        create a Session honours it too.
        """
        fenced = exists().where(ResourceCleanupOutbox.session_id == session_id)
        return bool((await self._db.execute(select(fenced))).scalar_one())

    async def targets_for_providers(
        self, providers: frozenset[str], target_ids: frozenset[str]
    ) -> list[TargetRow]:
        """Registered targets of ``providers`` (restricted to ``target_ids`` when non-empty)."""
        query = select(AgentTarget).where(AgentTarget.provider.in_(sorted(providers)))
        if target_ids:
            query = query.where(AgentTarget.agent_target_id.in_(sorted(target_ids)))
        query = query.order_by(AgentTarget.agent_target_id)
        return list((await self._db.execute(query)).scalars().all())

    async def with_active_turns(self, providers: frozenset[str]) -> list[SessionRow]:
        """Live Sessions of ``providers`` that have an active Turn (runtime-loss scan)."""
        query = select(Session).where(
            Session.active_turn_id.is_not(None),
            Session.provider.in_(sorted(providers)),
            Session.deleted_at_unix_ms.is_(None),
        )
        return list((await self._db.execute(query)).scalars().all())

    def next_message_cursor(self, row: SessionRow) -> tuple[int, int]:
        """Allocate ``(sequence, version)`` for a new message of ``row`` (mutates the row)."""
        sequence = row.next_message_sequence
        self.update(
            row, next_message_sequence=sequence + 1, message_version=row.message_version + 1
        )
        return sequence, row.message_version

    def next_message_version(self, row: SessionRow) -> int:
        """Allocate a version for a changed message of ``row`` (mutates the row)."""
        self.update(row, message_version=row.message_version + 1)
        return row.message_version
