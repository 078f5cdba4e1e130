"""Which Host replica holds which runtime (SCALE-2, ADR 0042).

With several replicas a runtime's link lives in one process, but a command may be produced
on any. :class:`ReplicaPresence` records every link this replica holds in the store
(``runtime_presence``: runtime, instance, the hello's identity, this replica's id) and renews a
lease on those rows while the process lives, so:

* ``RUNTIME_UNAVAILABLE`` considers runtimes attached anywhere (:func:`serving_identity`: the
  local registry first, a query only when no local link serves the Session);
* a runtime that returns as a new instance on another replica is recognised as restarted
  (the row keeps the instance after the link ends);
* the loss grace holds across replicas: a runtime attached anywhere is not lost, and the rows
  of a replica that died without detaching (``kill -9``) are claimed by a live replica once
  their lease ran out, which then runs the grace for them.

Single node (no shared bus): ``ctx.presence`` is ``None`` and nothing here runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from services.host.repository import runtime_presence
from services.host.runtime.registry import RuntimeIdentity, RuntimeLinkHandle

if TYPE_CHECKING:
    from services.host.context import HostContext

__all__ = ["ReplicaPresence", "decode_identity", "encode_identity", "serving_identity"]

_log = logging.getLogger(__name__)

Orphaned = Callable[[RuntimeIdentity], Awaitable[None]]
"""Called with the identity of a runtime whose replica died without detaching it."""


def encode_identity(identity: RuntimeIdentity) -> str:
    """The identity as stored in ``runtime_presence.identity_json``."""
    return json.dumps(
        {
            "providers": sorted(identity.providers),
            "targets": sorted(identity.target_ids),
            "workspaces": sorted(identity.workspaces),
            "capabilities": {key: bool(value) for key, value in identity.capabilities.items()},
        },
        sort_keys=True,
    )


def decode_identity(runtime_id: str, instance_id: str, encoded: str) -> RuntimeIdentity:
    """The identity :func:`encode_identity` stored."""
    data = json.loads(encoded)
    return RuntimeIdentity(
        runtime_id=runtime_id,
        instance_id=instance_id,
        providers=frozenset(data.get("providers", ())),
        target_ids=frozenset(data.get("targets", ())),
        capabilities=dict(data.get("capabilities", {})),
        workspaces=frozenset(data.get("workspaces", ())),
    )


class ReplicaPresence:
    """This replica's runtime links in the store, and the lookups of everyone's.

    Args:
        ctx: Host dependencies (store, clock, registry).
        lease_seconds: How long a row counts without a renewal; the heartbeat renews every
            third of it.
        replica_id: This process's id (a fresh one per start by default).
    """

    def __init__(
        self, ctx: HostContext, *, lease_seconds: float, replica_id: str | None = None
    ) -> None:
        self._ctx = ctx
        self.replica_id = replica_id or f"host-{uuid.uuid4()}"
        self._lease_ms = max(1, round(lease_seconds * 1000))
        self._heartbeat: asyncio.Task[None] | None = None
        self._orphaned: Orphaned | None = None
        self._recorded: set[str] = set()
        """Links of this process whose attachment is in the store."""

    def _expires(self) -> int:
        return self._ctx.clock() + self._lease_ms

    async def attached(self, handle: RuntimeLinkHandle) -> str | None:
        """Record ``handle`` as held here; the runtime's previously recorded instance.

        Raises:
            domainerrors.Unavailable, domainerrors.Aborted: the store refused the write (the
                link ends and the runtime reconnects).
        """
        identity = handle.identity
        now = self._ctx.clock()
        previous = await self._ctx.write(
            lambda conn: runtime_presence.attach(
                conn,
                runtime_id=identity.runtime_id,
                instance_id=identity.instance_id,
                replica_id=self.replica_id,
                link_id=handle.link_id,
                identity_json=encode_identity(identity),
                now=now,
                expires=now + self._lease_ms,
            )
        )
        self._recorded.add(handle.link_id)
        return previous

    async def detached(self, handle: RuntimeLinkHandle) -> None:
        """Record that ``handle`` ended (a newer link elsewhere keeps its row)."""
        self._recorded.discard(handle.link_id)
        now = self._ctx.clock()
        try:
            await self._ctx.write(
                lambda conn: runtime_presence.detach(
                    conn,
                    runtime_id=handle.identity.runtime_id,
                    replica_id=self.replica_id,
                    link_id=handle.link_id,
                    now=now,
                )
            )
        except Exception:  # noqa: BLE001 - the lease expires the row anyway
            _log.warning("could not record the end of link %s", handle.link_id, exc_info=True)

    async def identities(self) -> list[RuntimeIdentity]:
        """Every runtime attached to a live replica (this one included), newest first."""
        now = self._ctx.clock()
        rows = await self._ctx.read(
            lambda conn: runtime_presence.live_rows(conn, now=now), one_statement=True
        )
        return [
            decode_identity(row.runtime_id, row.instance_id, row.identity_json)
            for row in reversed(rows)
        ]

    async def attached_anywhere(self, runtime_id: str) -> bool:
        """Whether ``runtime_id`` is attached to a live replica."""
        now = self._ctx.clock()
        return await self._ctx.read(
            lambda conn: runtime_presence.attached_anywhere(conn, runtime_id=runtime_id, now=now),
            one_statement=True,
        )

    def start(self, orphaned: Orphaned) -> None:
        """Start the heartbeat; ``orphaned`` runs for each runtime of a replica that died."""
        self._orphaned = orphaned
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        """Stop the heartbeat and mark this replica's rows detached (idempotent)."""
        task, self._heartbeat = self._heartbeat, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        now = self._ctx.clock()
        try:
            await self._ctx.write(
                lambda conn: runtime_presence.release_replica(
                    conn, replica_id=self.replica_id, now=now
                )
            )
        except Exception:  # noqa: BLE001 - the lease expires the rows anyway
            _log.warning("could not release this replica's runtime rows", exc_info=True)

    async def _beat(self) -> None:
        interval = self._lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.beat()
            except Exception:  # noqa: BLE001 - the next beat tries again
                _log.warning("runtime presence heartbeat failed", exc_info=True)

    async def beat(self) -> None:
        """Renew this replica's leases, then claim the rows of replicas that stopped renewing."""
        expires = self._expires()
        await self._ctx.write(
            lambda conn: runtime_presence.renew(conn, replica_id=self.replica_id, expires=expires)
        )
        await self._close_superseded()
        now = self._ctx.clock()
        claimed = await self._ctx.write(lambda conn: runtime_presence.claim_expired(conn, now=now))
        for row in claimed:
            _log.info("runtime %s was held by a replica that stopped", row.runtime_id)
            if self._orphaned is not None:
                await self._orphaned(
                    decode_identity(row.runtime_id, row.instance_id, row.identity_json)
                )

    async def _close_superseded(self) -> None:
        """Close local links whose runtime has since attached to another replica.

        A runtime that reconnected elsewhere while its old stream here looked alive (a
        half-open connection) must not keep receiving commands here: the row names the other
        replica now. Only links recorded before the read are judged, so a link attaching here
        meanwhile is never mistaken for a superseded one.
        """
        recorded = [h for h in self._ctx.runtimes.links() if h.link_id in self._recorded]
        if not recorded:
            return
        now = self._ctx.clock()
        rows = await self._ctx.read(
            lambda conn: runtime_presence.live_rows(conn, now=now), one_statement=True
        )
        holders = {row.runtime_id: row.replica_id for row in rows}
        for handle in recorded:
            holder = holders.get(handle.identity.runtime_id)
            if holder is not None and holder != self.replica_id:
                _log.info(
                    "runtime %s attached to another replica; closing its link %s here",
                    handle.identity.runtime_id,
                    handle.link_id,
                )
                handle.replaced = True  # the stream ends ABORTED RUNTIME_LINK_REPLACED
                handle.close()


async def serving_identity(
    ctx: HostContext, workspace_id: str, agent_target_id: str | None, provider: str
) -> RuntimeIdentity | None:
    """The runtime that serves this Session's target on any replica (HOST-RT-1, SCALE-2).

    A link in this process answers at once (no query: the single node and the common case);
    otherwise, with several replicas, the newest runtime attached to a live replica.
    """
    link = ctx.runtimes.link_for(workspace_id, agent_target_id, provider)
    if link is not None:
        return link.identity
    if ctx.presence is None:
        return None
    for identity in await ctx.presence.identities():
        if identity.serves(workspace_id, agent_target_id, provider):
            return identity
    return None
