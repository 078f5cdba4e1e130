"""Connected runtimes (HOST-RT-1): which link serves which agent target.

A runtime connects *to* Host over ``RuntimeLink`` and names, in its hello, the providers
and agent targets it serves. The registry keeps one :class:`RuntimeLinkHandle` per
``runtime_id`` (a newer link replaces the older one) and routes commands for a Session to
the newest link that serves the Session's provider and target inside the workspaces of
the runtime's token. The registry holds this process's links; with several replicas
``services.host.runtime.presence`` records them in the store so the others can route to them
(SCALE-2, ADR 0042). Durable facts (commands, reports) are in the store.

This module never imports grpc: the wire layer drains :attr:`RuntimeLinkHandle.outbound`
onto the stream and feeds acknowledgements back through :meth:`RuntimeLinkHandle.resolve_ack`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_REVISION = 2
"""The runtime-link revision this Host speaks.

Revision 2 (ADR 0031): message snapshots carry the producer's classification and name their
Turn, Turn patches carry file-change snapshots, and disposition queries are answered.
"""


@dataclass(frozen=True)
class RuntimeIdentity:
    """What a runtime's hello and token say about it.

    Attributes:
        runtime_id: Stable identity of the runtime deployment.
        instance_id: This process incarnation; a new one means the old sessions are dead.
        providers: Providers the runtime executes (open vocabulary).
        target_ids: Agent targets it serves; empty means every target of ``providers``.
        capabilities: Delivery features it supports (``guidance``, ``interrupt`` ...).
        workspaces: Workspaces of its token (``"*"`` grants all).
    """

    runtime_id: str
    instance_id: str
    providers: frozenset[str]
    target_ids: frozenset[str]
    capabilities: Mapping[str, bool]
    workspaces: frozenset[str]

    def may_access(self, workspace_id: str) -> bool:
        """Whether the runtime's token covers ``workspace_id``."""
        return "*" in self.workspaces or workspace_id in self.workspaces

    def serves(self, workspace_id: str, agent_target_id: str | None, provider: str) -> bool:
        """Whether Sessions of this workspace, target and provider route to this runtime."""
        if not self.may_access(workspace_id) or provider not in self.providers:
            return False
        return not self.target_ids or (agent_target_id or "") in self.target_ids


@dataclass(frozen=True)
class OutboundCommand:
    """A command on its way to a runtime (the proto3-JSON shape of its payload)."""

    command_id: str
    workspace_id: str
    session_id: str
    issued_at_unix_ms: int
    kind: str
    """The ``RuntimeCommand.command`` oneof field name, for example ``start_turn``."""
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class CommandAck:
    """A runtime's verdict on one command."""

    command_id: str
    status: str
    """``accepted`` | ``rejected`` | ``failed``."""
    reason: str | None = None
    message: str | None = None


class LinkClosed(Exception):
    """The link closed before the awaited acknowledgement arrived."""


_link_numbers = itertools.count(1)


@dataclass(frozen=True)
class AckWait:
    """How waiting for one command's acknowledgement ended.

    Attributes:
        verdict: The runtime's acknowledgement, or ``None`` when none came (timeout or a
            closed link).
        timed_out: No verdict within the wait.
    """

    verdict: CommandAck | None
    timed_out: bool

    @property
    def accepted(self) -> bool:
        """Whether the runtime accepted the command."""
        return self.verdict is not None and self.verdict.status == "accepted"


@dataclass(eq=False)
class RuntimeLinkHandle:
    """One connected link: its identity, outbound queue and awaited acknowledgements."""

    identity: RuntimeIdentity
    link_id: str = field(default_factory=lambda: f"link-{next(_link_numbers)}")
    outbound: asyncio.Queue[OutboundCommand | None] = field(default_factory=asyncio.Queue)
    replaced: bool = False
    _acks: dict[str, asyncio.Future[CommandAck]] = field(default_factory=dict)

    def send(self, command: OutboundCommand) -> None:
        """Queue ``command`` for the stream (never blocks)."""
        self.outbound.put_nowait(command)

    def expect_ack(self, command_id: str) -> asyncio.Future[CommandAck]:
        """A future resolved when the runtime acknowledges ``command_id``."""
        future = self._acks.get(command_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._acks[command_id] = future
        return future

    def forget_ack(self, command_id: str) -> None:
        """Stop waiting for ``command_id`` (the waiter gave up; a late ack is still recorded)."""
        future = self._acks.pop(command_id, None)
        if future is not None and not future.done():
            future.cancel()

    async def wait_for_ack(
        self, command_id: str, ack: asyncio.Future[CommandAck], seconds: float
    ) -> AckWait:
        """Wait up to ``seconds`` for the verdict ``expect_ack`` promised.

        Anything but an acceptance stops the wait (a late acknowledgement is still recorded,
        nobody waits for it); so does a cancelled caller, whose command keeps its retry.
        """
        # asyncio.wait, not wait_for: the future must survive the timeout undisturbed.
        try:
            done, _ = await asyncio.wait({ack}, timeout=seconds)
        except asyncio.CancelledError:
            self.forget_ack(command_id)
            raise
        verdict = None
        if done and not ack.cancelled() and ack.exception() is None:
            verdict = ack.result()
        waited = AckWait(verdict, timed_out=not done)
        if not waited.accepted:
            self.forget_ack(command_id)
        return waited

    def resolve_ack(self, ack: CommandAck) -> None:
        """Wake whoever awaits this acknowledgement."""
        future = self._acks.pop(ack.command_id, None)
        if future is not None and not future.done():
            future.set_result(ack)

    def close(self) -> None:
        """Stop the outbound stream and fail every awaited acknowledgement."""
        self.outbound.put_nowait(None)
        for future in self._acks.values():
            if not future.done():
                future.set_exception(LinkClosed(self.link_id))
        self._acks.clear()


class RuntimeRegistry:
    """The connected runtimes of this Host process."""

    def __init__(self) -> None:
        self._links: dict[str, RuntimeLinkHandle] = {}
        self._instances: dict[str, str] = {}
        self._loss_timers: dict[str, asyncio.Task[None]] = {}
        self._draining = False

    def attach(self, handle: RuntimeLinkHandle) -> tuple[RuntimeLinkHandle | None, str | None]:
        """Make ``handle`` the link of its runtime.

        Returns:
            ``(replaced, dead_instance)``: the older link of the same runtime (the caller
            closes it) and the previous instance id when the runtime restarted (its
            provider sessions are confirmed dead), else ``None``.
        """
        runtime_id = handle.identity.runtime_id
        replaced = self._links.get(runtime_id)
        if replaced is not None:
            replaced.replaced = True
        self._links[runtime_id] = handle
        previous = self._instances.get(runtime_id)
        self._instances[runtime_id] = handle.identity.instance_id
        timer = self._loss_timers.pop(runtime_id, None)
        if timer is not None:
            timer.cancel()
        dead = (
            previous if previous is not None and previous != handle.identity.instance_id else None
        )
        return replaced, dead

    def detach(self, handle: RuntimeLinkHandle) -> bool:
        """Forget ``handle``; ``True`` when it was still the runtime's current link."""
        runtime_id = handle.identity.runtime_id
        if self._links.get(runtime_id) is handle:
            del self._links[runtime_id]
            return True
        return False

    def schedule_loss(self, runtime_id: str, timer: asyncio.Task[None]) -> None:
        """Remember the grace timer of a disconnected runtime (cancelled on reconnect).

        A draining process starts none: its links end because it stops, not because the
        runtime was lost, and the next Host process owns the grace.
        """
        if self._draining:
            timer.cancel()
            return
        old = self._loss_timers.pop(runtime_id, None)
        if old is not None:
            old.cancel()
        self._loss_timers[runtime_id] = timer

    def loss_done(self, runtime_id: str, timer: asyncio.Task[None] | None) -> None:
        """Drop a finished grace timer."""
        if self._loss_timers.get(runtime_id) is timer:
            del self._loss_timers[runtime_id]

    def is_connected(self, runtime_id: str) -> bool:
        """Whether a link of ``runtime_id`` is connected."""
        return runtime_id in self._links

    def link_for(
        self, workspace_id: str, agent_target_id: str | None, provider: str
    ) -> RuntimeLinkHandle | None:
        """The newest connected link serving this workspace, target and provider."""
        for handle in reversed(list(self._links.values())):
            if handle.identity.serves(workspace_id, agent_target_id, provider):
                return handle
        return None

    def links(self) -> list[RuntimeLinkHandle]:
        """Every connected link (oldest first)."""
        return list(self._links.values())

    async def shutdown(self) -> None:
        """Close every link and cancel grace timers (a drain hook; idempotent).

        Each stream then ends with ``UNAVAILABLE`` ``DRAINING`` and its runtime reconnects
        to another Host.
        """
        self._draining = True
        timers = list(self._loss_timers.values())
        self._loss_timers.clear()
        for timer in timers:
            timer.cancel()
        for handle in self.links():
            handle.close()
