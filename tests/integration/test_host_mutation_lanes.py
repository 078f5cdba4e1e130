"""Per-Session mutation lanes serialize lifecycle mutations (HOST-LANE-1), both backends.

The runtime-settings port is replaced by a fake that records when it runs and holds the
lane for a while; concurrent mutations of the same Session must never run inside it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from services.host import sessions, targets
from services.host.context import HostContext
from services.host.records import (
    AgentTargetRecord,
    Capabilities,
    LaunchRef,
    ModelOption,
    SessionSettingsValue,
    SettingsCatalog,
)
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
