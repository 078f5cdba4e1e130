"""A lane holder waiting for its runtime lends the lane to the Session's reports (HOST-LANE-1)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from services.host.model.mutation_lanes import MutationLanes

KEY = ("ws-1", "s-1")


async def _settle() -> None:
    """Let every runnable task run until it blocks."""
    for _ in range(20):
        await asyncio.sleep(0)


Body = Callable[[str, asyncio.Event], Coroutine[Any, Any, None]]


def _recorder(lanes: MutationLanes, log: list[str]) -> tuple[Body, Body]:
    async def exclusive(name: str, release: asyncio.Event) -> None:
        async with lanes.hold(*KEY):
            log.append(f"{name} in")
            await release.wait()
            log.append(f"{name} out")

    async def report(name: str, release: asyncio.Event) -> None:
        async with lanes.hold_for_report(*KEY):
            log.append(f"{name} in")
            await release.wait()
            log.append(f"{name} out")

    return exclusive, report


@pytest.mark.spec("HOST-LANE-1")
def test_reports_wait_for_a_holder_that_does_not_lend() -> None:
    async def scenario() -> list[str]:
        lanes, log = MutationLanes(), list[str]()
        exclusive, report = _recorder(lanes, log)
        first, second = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(exclusive("stop", first))]
        await _settle()
        tasks.append(asyncio.create_task(report("report", second)))
        await _settle()
        assert log == ["stop in"]
        first.set()
        second.set()
        await asyncio.gather(*tasks)
        assert lanes.active() == 0
        return log

    assert asyncio.run(scenario()) == ["stop in", "stop out", "report in", "report out"]


@pytest.mark.spec("HOST-LANE-1")
def test_on_a_loan_reports_enter_in_order_and_other_mutations_still_wait() -> None:
    async def scenario() -> list[str]:
        lanes, log = MutationLanes(), list[str]()
        exclusive, report = _recorder(lanes, log)
        acked, gates = asyncio.Event(), {n: asyncio.Event() for n in ("settings", "r1", "r2")}

        async def activation() -> None:
            async with lanes.hold(*KEY):
                log.append("activation in")
                async with lanes.lend_to_reports(*KEY):
                    await acked.wait()
                log.append("activation out")

        tasks = [asyncio.create_task(activation())]
        await _settle()
        tasks.append(asyncio.create_task(exclusive("settings", gates["settings"])))
        tasks.append(asyncio.create_task(report("r1", gates["r1"])))
        tasks.append(asyncio.create_task(report("r2", gates["r2"])))
        await _settle()
        # r1 runs on the loan; settings (queued before it) and r2 wait.
        assert log == ["activation in", "r1 in"]
        gates["r1"].set()
        await _settle()
        assert log[-2:] == ["r1 out", "r2 in"]
        acked.set()  # the holder stops lending but first waits for r2 to finish
        await _settle()
        assert "activation out" not in log
        gates["r2"].set()
        await _settle()
        assert log[-3:] == ["r2 out", "activation out", "settings in"]
        gates["settings"].set()
        await asyncio.gather(*tasks)
        assert lanes.active() == 0
        return log

    asyncio.run(scenario())


@pytest.mark.spec("HOST-LANE-1")
def test_a_report_queued_before_the_loan_enters_when_the_loan_begins() -> None:
    async def scenario() -> None:
        lanes, log = MutationLanes(), list[str]()
        _, report = _recorder(lanes, log)
        lend, acked, done = asyncio.Event(), asyncio.Event(), asyncio.Event()
        done.set()

        async def holder() -> None:
            async with lanes.hold(*KEY):
                await lend.wait()
                async with lanes.lend_to_reports(*KEY):
                    await acked.wait()

        tasks = [asyncio.create_task(holder())]
        await _settle()
        tasks.append(asyncio.create_task(report("r1", done)))
        await _settle()
        assert log == []
        lend.set()
        await _settle()
        assert log == ["r1 in", "r1 out"]
        acked.set()
        await asyncio.gather(*tasks)
        assert lanes.active() == 0

    asyncio.run(scenario())


@pytest.mark.spec("HOST-LANE-1")
def test_a_waiter_cancelled_in_the_queue_is_skipped_and_only_the_holder_may_lend() -> None:
    async def scenario() -> list[str]:
        lanes, log = MutationLanes(), list[str]()
        exclusive, report = _recorder(lanes, log)
        release = asyncio.Event()
        holder = asyncio.create_task(exclusive("holder", release))
        await _settle()
        cancelled = asyncio.create_task(exclusive("cancelled", release))
        after = asyncio.create_task(report("after", release))
        await _settle()
        cancelled.cancel()
        release.set()
        await asyncio.gather(holder, after)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(RuntimeError, match="non-holder"):
            async with lanes.lend_to_reports(*KEY):
                pass
        assert lanes.active() == 0
        return log

    assert asyncio.run(scenario()) == ["holder in", "holder out", "after in", "after out"]


@pytest.mark.spec("HOST-LANE-1")
def test_a_holder_cancelled_during_its_loan_lets_nobody_in_before_the_report_is_done() -> None:
    async def scenario() -> list[str]:
        lanes, log = MutationLanes(), list[str]()
        exclusive, report = _recorder(lanes, log)
        report_done, stop_done, acked = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def activation() -> None:
            async with lanes.hold(*KEY), lanes.lend_to_reports(*KEY):
                await acked.wait()

        holder = asyncio.create_task(activation())
        await _settle()
        on_loan = asyncio.create_task(report("report", report_done))
        stop = asyncio.create_task(exclusive("stop", stop_done))
        await _settle()
        acked.set()  # the holder waits for the report on its loan ...
        await _settle()
        holder.cancel()  # ... and is cancelled there
        await _settle()
        assert log == ["report in"]  # the stop still waits
        report_done.set()
        stop_done.set()
        await asyncio.gather(on_loan, stop)
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert lanes.active() == 0
        return log

    assert asyncio.run(scenario()) == ["report in", "report out", "stop in", "stop out"]
