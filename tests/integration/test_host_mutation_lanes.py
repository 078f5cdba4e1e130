"""Per-Session mutation lanes serialize lifecycle mutations (HOST-LANE-1), both backends.

The runtime-settings port is replaced by a fake that records when it runs and holds the
lane for a while; concurrent mutations of the same Session (a rename, another update, a
``StopTurn``) must never run inside it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from services.host import sessions, targets, turns
from services.host.activity_store import ActivityRepositories, activity_runner
from services.host.context import HostContext
from services.host.records import (
    AgentTargetRecord,
    Capabilities,
    LaunchRef,
    ModelOption,
    SessionSettingsValue,
    SettingsCatalog,
)
from services.host.runtime_registry import RuntimeIdentity, RuntimeLinkHandle
from services.host.runtime_settings import RuntimeSettingsOutcome
from store.database import Database


@dataclass
class RecordingRuntime:
    """A runtime-settings port that logs entry/exit and what it saw of the Session."""

    ctx: HostContext | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    titles: list[tuple[str, str]] = field(default_factory=list)

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
        before = await sessions.read_live_session(self.ctx, workspace_id, session_id)
        await asyncio.sleep(0.05)  # a slow runtime: others must wait in the lane
        after = await sessions.read_live_session(self.ctx, workspace_id, session_id)
        self.titles.append((before.title, after.title))
        self.events.append(("exit", label))
        return RuntimeSettingsOutcome("applied")


async def _scenario(url: str) -> RecordingRuntime:
    database = Database(url)
    await database.start()
    runtime = RecordingRuntime()
    ctx = HostContext(database=database, runtime_settings=runtime)
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
        await sessions.create_session(
            ctx,
            sessions.CreateSessionCommand(
                workspace_id="ws-1", agent_target_id="demo", cwd="/w", session_id="s-1"
            ),
        )

        async def settings(model: str) -> None:
            await sessions.update_session_settings(
                ctx, "ws-1", "s-1", SessionSettingsValue(model=model), ctx.runtime_settings
            )

        async def rename() -> None:
            await asyncio.sleep(0.01)  # arrive while the first update holds the lane
            await sessions.rename_session(ctx, "ws-1", "s-1", "renamed")

        await asyncio.gather(settings("a"), settings("b"), rename())
        assert ctx.lanes.active() == 0  # lanes are dropped once idle
    finally:
        await database.stop()
    return runtime


@pytest.mark.spec("HOST-LANE-1", "HOST-SES-6")
def test_concurrent_mutations_of_one_session_never_interleave(migrated_db_url: str) -> None:
    runtime = asyncio.run(_scenario(migrated_db_url))
    # Each update's persist + runtime application ran alone, in arrival order.
    assert runtime.events == [("enter", "a"), ("exit", "a"), ("enter", "b"), ("exit", "b")]
    # The rename never committed while an update held the lane.
    assert all(before == after for before, after in runtime.titles)


@pytest.mark.spec("HOST-LANE-1")
def test_lanes_of_different_sessions_do_not_block_each_other() -> None:
    from services.host.lanes import MutationLanes

    lanes = MutationLanes()
    order: list[str] = []

    async def hold(session_id: str, delay: float) -> None:
        async with lanes.hold("ws-1", session_id):
            order.append(f"in:{session_id}")
            await asyncio.sleep(delay)
            order.append(f"out:{session_id}")

    async def main() -> None:
        await asyncio.gather(hold("s-1", 0.05), hold("s-2", 0.0))

    asyncio.run(main())
    assert order.index("out:s-2") < order.index("out:s-1")


@dataclass
class TurnWatchingRuntime:
    """A slow runtime-settings port that records the active Turn's phase on entry and exit."""

    ctx: HostContext | None = None
    turn_id: str = ""
    events: list[str] = field(default_factory=list)
    phases: list[tuple[str, str]] = field(default_factory=list)

    async def _phase(self) -> str:
        assert self.ctx is not None

        async def read(repos: ActivityRepositories) -> str:
            turn = await repos.turns.get("ws-1", "s-1", self.turn_id)
            assert turn is not None
            return turn.phase

        return await activity_runner(self.ctx.database.engine).run(read, write=False)

    async def apply_settings(
        self,
        workspace_id: str,
        session_id: str,
        settings: SessionSettingsValue,
        capabilities: Capabilities,
    ) -> RuntimeSettingsOutcome:
        self.events.append("settings:enter")
        before = await self._phase()
        await asyncio.sleep(0.1)  # a slow runtime: a stop must wait in the lane
        after = await self._phase()
        self.phases.append((before, after))
        self.events.append("settings:exit")
        return RuntimeSettingsOutcome("applied")


async def _settings_vs_stop(url: str, *, stop_first: bool) -> TurnWatchingRuntime:
    database = Database(url)
    await database.start()
    runtime = TurnWatchingRuntime()
    ctx = HostContext(database=database, runtime_settings=runtime)
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
        created = await sessions.create_session(
            ctx,
            sessions.CreateSessionCommand(
                workspace_id="ws-1",
                agent_target_id="demo",
                cwd="/w",
                session_id="s-1",
                initial_input=sessions.InitialInput("c1", "hello"),
            ),
        )
        assert created.first_turn is not None
        runtime.turn_id = created.first_turn.turn.turn_id

        async def settings() -> None:
            if stop_first:
                await asyncio.sleep(0.02)  # arrive while the stop holds the lane
            await sessions.update_session_settings(
                ctx, "ws-1", "s-1", SessionSettingsValue(model="b"), ctx.runtime_settings
            )

        async def stop() -> None:
            if not stop_first:
                await asyncio.sleep(0.02)  # arrive while the update holds the lane
            await turns.stop_turn(ctx, "ws-1", "s-1", runtime.turn_id)
            runtime.events.append("stop:committed")

        await asyncio.gather(settings(), stop())
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
