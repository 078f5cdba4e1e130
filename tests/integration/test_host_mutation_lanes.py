"""Per-Session mutation lanes serialize lifecycle mutations (HOST-LANE-1), both backends.

The runtime-settings port is replaced by a fake that records when it runs and holds the
lane until the test releases it; concurrent mutations of the same Session (a rename,
another update, a ``StopTurn``) must never run inside it. Order is decided by events, never
by sleeping: the test waits until the holder is inside, starts the competing call, waits
until that call is queued on the lane (:class:`WatchedLanes`), checks it has not run, and
only then releases the holder.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from services.host.context import HostContext
from services.host.model.mutation_lanes import MutationLanes, SessionKey
from services.host.model.records import (
    AgentTargetRecord,
    Capabilities,
    LaunchRef,
    ModelOption,
    SessionSettingsValue,
    SettingsCatalog,
)
from services.host.repository.unit_of_work import HostTransaction
from services.host.runtime.registry import RuntimeIdentity, RuntimeLinkHandle
from services.host.runtime.settings_port import RuntimeSettingsOutcome
from services.host.sessions import commands, targets
from services.host.turns import stop_and_list
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database

T = TypeVar("T")

WAIT_SECONDS = 10.0
"""Upper bound of any wait for an event that must happen; only a failing test reaches it."""

SESSION = ("ws-1", "s-1")


async def _within(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, WAIT_SECONDS)


@dataclass
class Gate:
    """Where a holder of the lane stops: it sets ``entered``, then waits for ``release``."""

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def pass_through(self) -> None:
        self.entered.set()
        await self.release.wait()


class WatchedLanes(MutationLanes):
    """The real lanes, observable: how many callers wait to enter a Session's lane.

    A caller counts as waiting from the moment it asks for the lane until it holds it. The
    count is raised in the same step in which the caller then queues on the lane's lock, so
    once another task sees it, the caller is suspended in that queue (or already inside).
    ``pause_next_holder`` makes the next caller that gets a lane stop inside it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._waiting: Counter[SessionKey] = Counter()
        self._changed = asyncio.Event()
        self._pause: Gate | None = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @asynccontextmanager
    async def hold(self, workspace_id: str, session_id: str) -> AsyncIterator[None]:
        key = (workspace_id, session_id)
        self._waiting[key] += 1
        self._notify()
        inside = False
        try:
            async with super().hold(workspace_id, session_id):
                inside = True
                self._waiting[key] -= 1
                self._notify()
                if (pause := self._pause) is not None:
                    self._pause = None
                    await pause.pass_through()
                yield
        finally:
            if not inside:  # cancelled while queued
                self._waiting[key] -= 1
                self._notify()

    def waiting(self, workspace_id: str, session_id: str) -> int:
        """Callers queued for this Session's lane (not yet holding it)."""
        return self._waiting[(workspace_id, session_id)]

    async def until_waiting(self, workspace_id: str, session_id: str, count: int) -> None:
        """Return once exactly ``count`` callers are queued for this Session's lane."""

        async def changes() -> None:
            while self.waiting(workspace_id, session_id) != count:
                await self._changed.wait()

        await _within(changes())

    def pause_next_holder(self) -> Gate:
        """The next caller to get a lane stops inside it until the gate is released."""
        self._pause = Gate()
        return self._pause


@dataclass
class RecordingRuntime:
    """A runtime-settings port that logs entry/exit and what it saw of the Session.

    Each application (by model label) stops at its own gate, inside the Session's lane.
    """

    ctx: HostContext | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    titles: list[tuple[str, str]] = field(default_factory=list)
    gates: dict[str, Gate] = field(default_factory=dict)

    def gate(self, label: str) -> Gate:
        return self.gates.setdefault(label, Gate())

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        label = settings.model or "?"
        assert self.ctx is not None
        self.events.append(("enter", label))
        before = await commands.read_live_session(self.ctx, workspace_id, session_id)
        await self.gate(label).pass_through()  # a slow runtime: others must wait in the lane
        after = await commands.read_live_session(self.ctx, workspace_id, session_id)
        self.titles.append((before.title, after.title))
        self.events.append(("exit", label))
        return RuntimeSettingsOutcome("applied")


async def _scenario(url: str) -> RecordingRuntime:
    database = Database(url)
    await database.start()
    runtime = RecordingRuntime()
    lanes = WatchedLanes()
    ctx = HostContext(
        database=database, command_codec=ProtoCommandCodec(), runtime_settings=runtime, lanes=lanes
    )
    runtime.ctx = ctx
    try:
        await targets.register_target(
            ctx,
            AgentTargetRecord(
                agent_target_id="demo",
                provider="demo",
                launch_ref=LaunchRef("runtime://demo"),
                settings_catalog=SettingsCatalog(
                    models=(ModelOption("a"), ModelOption("b")), default_model_id="a"
                ),
            ),
        )
        await commands.create_session(
            ctx,
            commands.CreateSessionCommand(
                workspace_id="ws-1", agent_target_id="demo", cwd="/w", session_id="s-1"
            ),
        )

        async def settings(model: str) -> None:
            await commands.update_session_settings(
                ctx, "ws-1", "s-1", SessionSettingsValue(model=model), ctx.runtime_settings
            )

        first = asyncio.create_task(settings("a"))
        await _within(runtime.gate("a").entered.wait())  # "a" holds the lane
        # "b" and then a rename arrive while "a" holds the lane: both queue, in that order.
        second = asyncio.create_task(settings("b"))
        await lanes.until_waiting(*SESSION, 1)
        rename = asyncio.create_task(commands.rename_session(ctx, *SESSION, "renamed"))
        await lanes.until_waiting(*SESSION, 2)
        assert runtime.events == [("enter", "a")]
        assert not second.done()
        assert not rename.done()
        runtime.gate("a").release.set()
        await _within(runtime.gate("b").entered.wait())  # "b" is next, not the rename
        assert lanes.waiting(*SESSION) == 1
        assert not rename.done()
        runtime.gate("b").release.set()
        await _within(asyncio.gather(first, second, rename))
        assert rename.result().title == "renamed"
        assert ctx.lanes.active() == 0  # lanes are dropped once idle
    finally:
        await database.stop()
    return runtime


@pytest.mark.spec("HOST-LANE-1", "HOST-SES-6")
def test_concurrent_mutations_of_one_session_never_interleave(migrated_db_url: str) -> None:
    runtime = asyncio.run(_scenario(migrated_db_url))
    # Each update's persist + runtime application ran alone, in arrival order.
    assert runtime.events == [("enter", "a"), ("exit", "a"), ("enter", "b"), ("exit", "b")]
    # The rename (queued during "a") never committed while an update held the lane.
    assert len(runtime.titles) == 2
    assert all(before == after != "renamed" for before, after in runtime.titles)


@pytest.mark.spec("HOST-LANE-1")
def test_lanes_of_different_sessions_do_not_block_each_other() -> None:
    from services.host.model.mutation_lanes import MutationLanes

    lanes = MutationLanes()
    order: list[str] = []
    gate = Gate()

    async def hold_s1() -> None:
        async with lanes.hold("ws-1", "s-1"):
            order.append("in:s-1")
            await gate.pass_through()
            order.append("out:s-1")

    async def pass_s2() -> None:
        async with lanes.hold("ws-1", "s-2"):
            order.append("in:s-2")
        order.append("out:s-2")

    async def main() -> None:
        first = asyncio.create_task(hold_s1())
        await _within(gate.entered.wait())  # s-1's lane is held
        await _within(pass_s2())  # s-2 gets in and out meanwhile
        assert not first.done()
        gate.release.set()
        await _within(first)

    asyncio.run(main())
    assert order == ["in:s-1", "in:s-2", "out:s-2", "out:s-1"]


@dataclass
class TurnWatchingRuntime:
    """A slow runtime-settings port that records the active Turn's phase on entry and exit.

    It stops at ``gate`` between the two reads, inside the Session's lane.
    """

    ctx: HostContext | None = None
    turn_id: str = ""
    events: list[str] = field(default_factory=list)
    phases: list[tuple[str, str]] = field(default_factory=list)
    gate: Gate = field(default_factory=Gate)

    async def _phase(self) -> str:
        assert self.ctx is not None

        async def read(repos: HostTransaction) -> str:
            turn = await repos.turns.get("ws-1", "s-1", self.turn_id)
            assert turn is not None
            return turn.phase

        return await self.ctx.transact(read, write=False)

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        self.events.append("settings:enter")
        before = await self._phase()
        await self.gate.pass_through()  # a slow runtime: a stop must wait in the lane
        after = await self._phase()
        self.phases.append((before, after))
        self.events.append("settings:exit")
        return RuntimeSettingsOutcome("applied")


async def _settings_vs_stop(url: str, *, stop_first: bool) -> TurnWatchingRuntime:
    database = Database(url)
    await database.start()
    runtime = TurnWatchingRuntime()
    lanes = WatchedLanes()
    ctx = HostContext(
        database=database, command_codec=ProtoCommandCodec(), runtime_settings=runtime, lanes=lanes
    )
    runtime.ctx = ctx
    # A connected runtime (its commands are only queued) so the Session can have a Turn.
    ctx.runtimes.attach(
        RuntimeLinkHandle(
            RuntimeIdentity("rt", "i-1", frozenset({"demo"}), frozenset(), {}, frozenset({"*"}))
        )
    )
    try:
        await targets.register_target(
            ctx,
            AgentTargetRecord(
                agent_target_id="demo",
                provider="demo",
                launch_ref=LaunchRef("runtime://demo"),
                settings_catalog=SettingsCatalog(
                    models=(ModelOption("a"), ModelOption("b")), default_model_id="a"
                ),
            ),
        )
        created = await commands.create_session(
            ctx,
            commands.CreateSessionCommand(
                workspace_id="ws-1",
                agent_target_id="demo",
                cwd="/w",
                session_id="s-1",
                initial_input=commands.InitialInput("c1", "hello"),
            ),
        )
        assert created.first_turn is not None
        runtime.turn_id = created.first_turn.turn.turn_id

        async def settings() -> None:
            await commands.update_session_settings(
                ctx, "ws-1", "s-1", SessionSettingsValue(model="b"), ctx.runtime_settings
            )

        async def stop() -> None:
            await stop_and_list.stop_turn(ctx, "ws-1", "s-1", runtime.turn_id)
            runtime.events.append("stop:committed")

        if stop_first:
            runtime.gate.release.set()  # the runtime answers at once; the stop holds the lane
            holder = lanes.pause_next_holder()
            first = asyncio.create_task(stop())
        else:
            holder = runtime.gate  # the update holds the lane inside the runtime application
            first = asyncio.create_task(settings())
        await _within(holder.entered.wait())
        second = asyncio.create_task(settings() if stop_first else stop())
        await lanes.until_waiting(*SESSION, 1)  # the other mutation queues behind the holder
        assert runtime.events == ([] if stop_first else ["settings:enter"])
        assert not second.done()
        holder.release.set()
        await _within(asyncio.gather(first, second))
        assert ctx.lanes.active() == 0
    finally:
        await database.stop()
    return runtime


@pytest.mark.spec("HOST-LANE-1", "HOST-SES-6", "HOST-TURN-4")
def test_a_settings_update_racing_a_stop_is_serialized(migrated_db_url: str) -> None:
    # The update holds the lane first: the stop commits only after the runtime answered.
    runtime = asyncio.run(_settings_vs_stop(migrated_db_url, stop_first=False))
    assert runtime.events == ["settings:enter", "settings:exit", "stop:committed"]
    assert runtime.phases == [("queued", "queued")]


@pytest.mark.spec("HOST-LANE-1", "HOST-SES-6", "HOST-TURN-4")
def test_a_stop_racing_a_settings_update_is_serialized(migrated_db_url: str) -> None:
    # The stop holds the lane first: the update sees the settled Turn from start to end.
    runtime = asyncio.run(_settings_vs_stop(migrated_db_url, stop_first=True))
    assert runtime.events == ["stop:committed", "settings:enter", "settings:exit"]
    assert runtime.phases == [("settled", "settled")]
