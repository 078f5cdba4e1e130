"""The runtime command outbox: commands written with the facts that cause them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy import bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from services.host.repository.changes import apply_fields
from services.host.repository.row_views import CommandRow
from store.models import RuntimeCommandOutbox, Session

UNACKNOWLEDGED = ("pending", "dispatched")
ACKNOWLEDGED = ("completed", "failed")

AWAITED_COMMAND_KINDS = ("apply_settings", "resume_session")
"""Commands a caller waits for (live settings, HOST-SES-6; activation, HOST-SES-9): a rejected
one stays ``failed`` until its waiter settles it (``command_outbox.withdraw_awaited``)."""

_SESSION_CHUNK: Final = 500
"""Session ids per ``IN`` list when reading several Sessions' open commands."""

PRUNE_BATCH: Final = 16
"""Most acknowledged rows one acknowledgement transaction deletes besides its own, so the
cleanup stays a bounded amount of work under the write lock."""

_Outbox = RuntimeCommandOutbox

# Built once (compiled-statement cache): the dispatch of every command and every
# acknowledgement run these.
_PENDING_OF_SESSION: Final = (
    select(_Outbox)
    .where(
        _Outbox.workspace_id == bindparam("workspace_id"),
        _Outbox.state == "pending",
        _Outbox.session_id == bindparam("session_id"),
    )
    .order_by(_Outbox.id)
    .with_for_update()
    .execution_options(populate_existing=True)
)
_BY_COMMAND_ID: Final = select(_Outbox).where(_Outbox.command_id == bindparam("command_id"))
_BY_COMMAND_ID_LOCKED: Final = _BY_COMMAND_ID.with_for_update().execution_options(
    populate_existing=True
)


@dataclass(frozen=True)
class SessionRoute:
    """A Session as command routing needs it: its key and what selects its runtime."""

    workspace_id: str
    session_id: str
    agent_target_id: str | None
    provider: str


def pending_values(
    route: tuple[str, str],
    command_id: str,
    encoded: tuple[str, str],
    operation_id: str | None,
    now: int,
) -> dict[str, object]:
    """The columns of a new ``pending`` row (``route``: workspace and Session id)."""
    return {
        "workspace_id": route[0],
        "session_id": route[1],
        "command_id": command_id,
        "command_kind": encoded[0],
        "operation_id": operation_id,
        "payload_json": encoded[1],
        "state": "pending",
        "attempts": 0,
        "next_attempt_at_unix_ms": now,
        "created_at_unix_ms": now,
        "updated_at_unix_ms": now,
    }


class RuntimeCommandRepository:
    """Reads and writes outbox rows."""

    def __init__(self, session: AsyncSession) -> None:
        self._db = session
        self._staged: list[RuntimeCommandOutbox] = []

    def add_pending(
        self,
        route: tuple[str, str],
        command_id: str,
        encoded: tuple[str, str],
        *,
        operation_id: str | None,
        now: int,
    ) -> None:
        """Stage a pending command of a Session (``route``: workspace and Session id).

        ``encoded`` is the ``RuntimeCommand`` oneof field name and its payload JSON.
        """
        row = RuntimeCommandOutbox(**pending_values(route, command_id, encoded, operation_id, now))
        self._db.add(row)
        self._staged.append(row)

    async def insert_pending(
        self,
        routes: Sequence[tuple[str, str]],
        command_ids: Sequence[str],
        encoded: tuple[str, str],
        *,
        now: int,
    ) -> None:
        """Insert one pending command per Session at once (an ORM bulk ``INSERT``).

        Rows staged with :meth:`add_pending` are flushed first, so they keep their (earlier)
        ids and the runtime receives the commands in the order they were written.
        """
        if routes:
            await self._db.flush()
            await self._db.execute(
                insert(RuntimeCommandOutbox),
                [
                    pending_values(route, command_id, encoded, None, now)
                    for route, command_id in zip(routes, command_ids, strict=True)
                ],
            )

    @staticmethod
    def update(row: CommandRow, **values: object) -> None:
        """Change columns of a command row (written at the next flush)."""
        apply_fields(row, values)

    async def delete(self, row: CommandRow) -> None:
        """Delete an acknowledged row (the outbox keeps open work only)."""
        await self._db.delete(row)

    async def get(self, workspace_id: str, command_id: str) -> CommandRow | None:
        """The command by id."""
        query = select(RuntimeCommandOutbox).where(
            RuntimeCommandOutbox.workspace_id == workspace_id,
            RuntimeCommandOutbox.command_id == command_id,
        )
        return (await self._db.execute(query)).scalar_one_or_none()

    async def by_command_id(self, command_id: str, *, lock: bool = False) -> CommandRow | None:
        """The command by id in any workspace (acks carry only the id; ids are unique UUIDs).

        Served by ``ix_runtime_command_outbox_command``. ``lock`` takes the row lock on
        Postgres (SQLite write transactions hold the database lock already), so an
        acknowledgement and a withdrawal of the same command serialize, and the later one sees
        what the earlier one committed.
        """
        query = _BY_COMMAND_ID_LOCKED if lock else _BY_COMMAND_ID
        return (await self._db.execute(query, {"command_id": command_id})).scalars().first()

    async def of_operation(
        self, workspace_id: str, session_id: str, operation_id: str, kind: str
    ) -> list[CommandRow]:
        """The commands of one kind sent for a response operation, oldest first.

        Served by ``ix_runtime_command_outbox_session`` (a Session holds few rows).
        """
        query = (
            select(RuntimeCommandOutbox)
            .where(
                RuntimeCommandOutbox.workspace_id == workspace_id,
                RuntimeCommandOutbox.session_id == session_id,
                RuntimeCommandOutbox.operation_id == operation_id,
                RuntimeCommandOutbox.command_kind == kind,
            )
            .order_by(RuntimeCommandOutbox.id)
        )
        return list((await self._db.execute(query)).scalars().all())

    async def unacknowledged(
        self, workspace_id: str | None = None, session_id: str | None = None
    ) -> list[CommandRow]:
        """Pending or dispatched commands, oldest first (optionally of one Session).

        One Session's rows are served by ``ix_runtime_command_outbox_session``; all open rows
        by ``ix_runtime_command_outbox_due``. Unlocked: a dispatcher locks the rows it sends
        with :meth:`lock_open` or reads them with :meth:`pending_of`.
        """
        query = select(RuntimeCommandOutbox).where(RuntimeCommandOutbox.state.in_(UNACKNOWLEDGED))
        if workspace_id is not None:
            query = query.where(RuntimeCommandOutbox.workspace_id == workspace_id)
        if session_id is not None:
            query = query.where(RuntimeCommandOutbox.session_id == session_id)
        query = query.order_by(RuntimeCommandOutbox.id)
        return list((await self._db.execute(query)).scalars().all())

    async def undispatched_routes(self, providers: Sequence[str], limit: int) -> list[SessionRoute]:
        """Sessions of ``providers`` with a command never dispatched yet, oldest row first.

        The sweep of a replica that holds runtime links (SCALE-2, ADR 0042): a row that is
        still ``pending`` with no attempt was written where no link served its Session and
        its wake-up may have been lost. Rows put back by a ``failed`` acknowledgement
        (attempts > 0) are left to the Session's next dispatch, as before. Served by
        ``ix_runtime_command_outbox_due`` (``state`` first); at most ``limit`` Sessions.
        """
        if not providers:
            return []
        query = (
            select(
                RuntimeCommandOutbox.workspace_id,
                RuntimeCommandOutbox.session_id,
                Session.agent_target_id,
                Session.provider,
            )
            .join(
                Session,
                (Session.workspace_id == RuntimeCommandOutbox.workspace_id)
                & (Session.session_id == RuntimeCommandOutbox.session_id),
            )
            .where(
                RuntimeCommandOutbox.state == "pending",
                RuntimeCommandOutbox.attempts == 0,
                Session.provider.in_(list(providers)),
            )
            .order_by(RuntimeCommandOutbox.id)
            .limit(limit)
        )
        routes: dict[tuple[str, str], SessionRoute] = {}
        for workspace_id, session_id, target_id, provider in await self._db.execute(query):
            routes.setdefault(
                (workspace_id, session_id),
                SessionRoute(workspace_id, session_id, target_id, provider),
            )
        return list(routes.values())

    async def lock_open(self, ids: Sequence[int]) -> list[CommandRow]:
        """These rows, locked, that are still unacknowledged (oldest first).

        On Postgres the lock waits for a concurrent acknowledgement or withdrawal and the state
        is re-checked after it, so a row deleted or settled meanwhile is not sent.
        """
        rows: list[CommandRow] = []
        for start in range(0, len(ids), _SESSION_CHUNK):
            query = (
                select(RuntimeCommandOutbox)
                .where(
                    RuntimeCommandOutbox.id.in_(list(ids[start : start + _SESSION_CHUNK])),
                    RuntimeCommandOutbox.state.in_(UNACKNOWLEDGED),
                )
                .order_by(RuntimeCommandOutbox.id)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
            rows.extend((await self._db.execute(query)).scalars().all())
        return rows

    async def pending_of(self, workspace_id: str, session_ids: Sequence[str]) -> list[CommandRow]:
        """The ``pending`` commands of Sessions of one workspace, locked, oldest first.

        Served by ``ix_runtime_command_outbox_session``, one ``IN`` list per 500 Sessions. The
        rows are locked (Postgres) because the caller dispatches them: a concurrent
        acknowledgement or withdrawal commits first, and its row is then not returned. One
        Session's rows are read and locked by one statement; several Sessions' rows are found
        first and then locked in id order (:meth:`lock_open`), the order every dispatcher
        locks in, so two dispatchers never wait on each other in opposite order.
        """
        if len(session_ids) == 1:
            return await self._pending_of_session(workspace_id, session_ids[0])
        pending = (RuntimeCommandOutbox.workspace_id == workspace_id) & (
            RuntimeCommandOutbox.state == "pending"
        )
        ids: list[int] = []
        for start in range(0, len(session_ids), _SESSION_CHUNK):
            chunk = list(session_ids[start : start + _SESSION_CHUNK])
            ids.extend(
                (
                    await self._db.execute(
                        select(RuntimeCommandOutbox.id).where(
                            pending, RuntimeCommandOutbox.session_id.in_(chunk)
                        )
                    )
                ).scalars()
            )
        return [row for row in await self.lock_open(sorted(ids)) if row.state == "pending"]

    async def _pending_of_session(self, workspace_id: str, session_id: str) -> list[CommandRow]:
        """One Session's ``pending`` rows, locked, oldest first; staged rows included unwritten.

        A dispatcher marks the rows it returns ``dispatched``. A row staged by
        :meth:`add_pending` in this transaction and not flushed yet is returned as it is, after
        the stored ones (its id, given at the flush, is higher), so marking it folds into its
        ``INSERT`` instead of costing an ``INSERT`` and then an ``UPDATE``. That holds only
        while no stored outbox row has an unflushed change (one set back to ``pending`` or
        deleted in this transaction); otherwise everything is flushed first, as before.
        """
        params = {"workspace_id": workspace_id, "session_id": session_id}
        staged = [row for row in self._staged if row in self._db.new]
        if not staged or any(
            isinstance(row, RuntimeCommandOutbox) for row in (*self._db.dirty, *self._db.deleted)
        ):
            return list((await self._db.execute(_PENDING_OF_SESSION, params)).scalars().all())
        with self._db.no_autoflush:
            stored: list[CommandRow] = list(
                (await self._db.execute(_PENDING_OF_SESSION, params)).scalars().all()
            )
        return stored + [
            row
            for row in staged
            if row.workspace_id == workspace_id
            and row.session_id == session_id
            and row.state == "pending"
        ]
