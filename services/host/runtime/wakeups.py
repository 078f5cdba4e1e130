"""Cross-replica command delivery: bus wake-ups, the pending sweep, remote ack waits (SCALE-2).

The durable command outbox stays the only truth (HOST-RT-5, ADR 0013). With several Host
replicas a command is often written where no link serves its Session; then, after the commit:

* the writing replica publishes a **command wake-up** (a core-NATS signal, ``host-commands``)
  naming the Session and what routes it; every replica receives it and the one whose registry
  holds a serving link runs the existing dispatch from the outbox (rows locked and re-checked,
  marked ``dispatched``, sent after the commit) inside the Session's mutation lane, one
  dispatch at a time per Session, so the link receives the rows in outbox order;
* a replica holding links **sweeps** every ``interval`` the Sessions of its links' providers
  that have a never-dispatched row, so a lost wake-up delays a command, never loses it;
* the link's replica publishes an **ack wake-up** (``host-acks``) after recording the
  acknowledgement of an awaited command (live settings, activation), which wakes a waiter on
  another replica; that waiter also polls the durable row with backoff, so a lost ack
  wake-up costs latency only.

Signals are hints. Exactly-once sending rests on the row locks of the dispatch (a row is sent
by whoever marks it ``dispatched``); the runtime also deduplicates by ``command_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from services.host.repository import command_acks
from services.host.repository.command_rows import AWAITED_COMMAND_KINDS, SessionRoute
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.registry import AckWait, CommandAck

if TYPE_CHECKING:
    from services.host.context import HostContext

__all__ = ["ACKS", "COMMANDS", "CommandWakeups", "SignalPort"]

_log = logging.getLogger(__name__)

COMMANDS = "host-commands"
"""Signal name of a command wake-up."""

ACKS = "host-acks"
"""Signal name of an awaited command's acknowledgement."""

SWEEP_SESSIONS = 256
"""Most Sessions one sweep reads (the oldest rows first)."""

_POLL_FIRST_SECONDS = 0.05
_POLL_MAX_SECONDS = 1.0


class SignalPort(Protocol):
    """Fire-and-forget signals between replicas (``livelog.signals.NatsSignals``)."""

    async def publish(self, name: str, payload: bytes) -> bool:
        """Publish one signal; ``False`` when it could not be handed on."""
        ...

    async def subscribe(self, name: str, receive: Callable[[bytes], None]) -> None:
        """Deliver every signal ``name`` to ``receive``."""
        ...

    async def close(self) -> None:
        """Close the connection."""
        ...


class CommandWakeups:
    """This replica's side of cross-replica command delivery.

    Args:
        ctx: Host dependencies.
        signals: The signal connection.
        sweep_interval_seconds: How often the pending sweep runs while this replica holds
            links.
    """

    def __init__(
        self, ctx: HostContext, signals: SignalPort, *, sweep_interval_seconds: float
    ) -> None:
        self._ctx = ctx
        self._signals = signals
        self._sweep_interval = sweep_interval_seconds
        self._wanted: set[tuple[str, str]] = set()
        self._dispatchers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._awaited: dict[str, asyncio.Future[CommandAck]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to both signals and start the sweep."""
        await self._signals.subscribe(COMMANDS, self._on_command_wakeup)
        await self._signals.subscribe(ACKS, self._on_ack)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop the sweep and the dispatchers, close the connection (idempotent)."""
        tasks = [t for t in (self._sweeper, *self._dispatchers.values()) if t is not None]
        self._sweeper = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._signals.close()

    # ------------------------------------------------------------------ command wake-ups

    async def wake(self, routes: Sequence[SessionRoute]) -> None:
        """Tell every replica these Sessions have pending commands (after their commit)."""
        for route in routes:
            payload = json.dumps(
                {
                    "w": route.workspace_id,
                    "s": route.session_id,
                    "t": route.agent_target_id,
                    "p": route.provider,
                },
                separators=(",", ":"),
            ).encode()
            await self._signals.publish(COMMANDS, payload)

    def _on_command_wakeup(self, payload: bytes) -> None:
        data = json.loads(payload)
        route = SessionRoute(str(data["w"]), str(data["s"]), data.get("t"), str(data["p"]))
        self.dispatch_soon(route)

    def dispatch_soon(self, route: SessionRoute) -> bool:
        """Dispatch the Session's pending rows if a link here serves it; whether one does.

        Dispatches of one Session are coalesced: while one runs, further requests make it run
        once more afterwards, never a second one beside it.
        """
        ctx = self._ctx
        if ctx.runtimes.link_for(route.workspace_id, route.agent_target_id, route.provider) is None:
            return False
        key = (route.workspace_id, route.session_id)
        self._wanted.add(key)
        if key not in self._dispatchers:
            self._dispatchers[key] = asyncio.create_task(self._dispatch(key))
        return True

    async def _dispatch(self, key: tuple[str, str]) -> None:
        # Imported here: command_outbox imports this module's users, not the other way round.
        from services.host.turns.command_outbox import dispatch_session

        try:
            while key in self._wanted:
                self._wanted.discard(key)
                try:
                    # In the lane: this process's submits, stops and settings of the Session
                    # send in the same order their transactions committed.
                    async with self._ctx.lanes.hold(*key):
                        await dispatch_session(self._ctx, *key)
                except Exception:  # noqa: BLE001 - the sweep retries a row left pending
                    _log.warning("dispatch of %s/%s after a wake-up failed", *key, exc_info=True)
        finally:
            del self._dispatchers[key]

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            try:
                await self.sweep()
            except Exception:  # noqa: BLE001 - the next round tries again
                _log.warning("pending command sweep failed", exc_info=True)

    async def sweep(self) -> int:
        """Dispatch never-dispatched rows of Sessions a link here serves; how many Sessions."""
        links = self._ctx.runtimes.links()
        if not links:
            return 0
        providers = sorted({p for link in links for p in link.identity.providers})

        async def read(repos: HostTransaction) -> list[SessionRoute]:
            return await repos.commands.undispatched_routes(providers, SWEEP_SESSIONS)

        routes = await self._ctx.transact(read, write=False)
        return sum(self.dispatch_soon(route) for route in routes)

    # ---------------------------------------------------------------------- ack waits

    async def acknowledged(self, ack: CommandAck, kind: str | None) -> None:
        """Tell a waiter on another replica that an awaited command was acknowledged."""
        if kind not in AWAITED_COMMAND_KINDS:
            return
        payload = json.dumps(
            {"c": ack.command_id, "st": ack.status, "r": ack.reason, "m": ack.message},
            separators=(",", ":"),
        ).encode()
        await self._signals.publish(ACKS, payload)

    def _on_ack(self, payload: bytes) -> None:
        data = json.loads(payload)
        future = self._awaited.pop(str(data["c"]), None)
        if future is not None and not future.done():
            future.set_result(
                CommandAck(str(data["c"]), str(data["st"]), data.get("r"), data.get("m"))
            )

    def expect_ack(self, command_id: str) -> asyncio.Future[CommandAck]:
        """A future resolved by the ack wake-up of ``command_id``."""
        future = self._awaited.get(command_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._awaited[command_id] = future
        return future

    async def wait_for_ack(
        self, command_id: str, ack: asyncio.Future[CommandAck], seconds: float
    ) -> AckWait:
        """Wait up to ``seconds`` for the verdict of a command sent by another replica.

        The ack wake-up answers at once; meanwhile the durable row is read with backoff: a
        row gone (or completed) is an acceptance, a ``failed`` one a rejection. A ``failed``
        delivery (the row back to ``pending``) is seen only through the wake-up; without it
        the wait times out, and the caller's withdrawal settles the row as for a local link.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pause = _POLL_FIRST_SECONDS
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return AckWait(None, timed_out=True)
                done, _ = await asyncio.wait({ack}, timeout=min(pause, remaining))
                if done:
                    if ack.cancelled() or ack.exception() is not None:
                        return AckWait(None, timed_out=False)
                    return AckWait(ack.result(), timed_out=False)
                verdict = await self._stored_verdict(command_id)
                if verdict is not None:
                    return AckWait(verdict, timed_out=False)
                pause = min(pause * 2, _POLL_MAX_SECONDS)
        finally:
            self._awaited.pop(command_id, None)

    async def _stored_verdict(self, command_id: str) -> CommandAck | None:
        stored = await self._ctx.read(
            lambda conn: command_acks.stored_command(conn, command_id), one_statement=True
        )
        if stored is None or stored.state == "completed":
            return CommandAck(command_id, "accepted")
        if stored.state == "failed":
            return CommandAck(command_id, "rejected", message=stored.last_error)
        return None
