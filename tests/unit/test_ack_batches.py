"""A link's acknowledgements apply in order, gathered while one transaction runs (HOST-RT-5)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from services.host.runtime import ack_batches, link
from services.host.runtime.registry import CommandAck


def _ack(command_id: str) -> CommandAck:
    return CommandAck(command_id, "accepted", None, None)


class _Recorder:
    """Stands in for ``link.apply_acks``: records each transaction's acknowledgements."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail_on = fail_on

    async def apply_acks(self, ctx: Any, handle: Any, acks: Sequence[CommandAck]) -> None:
        self.batches.append([ack.command_id for ack in acks])
        await self.release.wait()
        if self.fail_on in [ack.command_id for ack in acks]:
            raise RuntimeError("the store refused the acknowledgements")


@pytest.mark.spec("HOST-RT-5")
def test_acknowledgements_arriving_during_a_transaction_go_together_into_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(link, "apply_acks", recorder.apply_acks)
    failures: list[BaseException] = []

    async def scenario() -> None:
        batches = ack_batches.AckBatches(Any, Any, failures.append)  # type: ignore[arg-type]
        batches.add(_ack("c-1"))
        await asyncio.sleep(0)  # the first transaction starts with c-1 alone
        for index in range(2, 6):
            batches.add(_ack(f"c-{index}"))
        settled = asyncio.create_task(batches.settled())
        await asyncio.sleep(0)
        assert not settled.done()  # it waits for every queued acknowledgement
        recorder.release.set()
        await settled
        await batches.close()

    asyncio.run(scenario())
    assert recorder.batches == [["c-1"], ["c-2", "c-3", "c-4", "c-5"]]
    assert failures == []


@pytest.mark.spec("HOST-RT-5")
def test_a_transaction_holds_at_most_its_bound_of_acknowledgements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder()
    recorder.release.set()
    monkeypatch.setattr(link, "apply_acks", recorder.apply_acks)
    bound = ack_batches.MAX_ACKS_PER_TRANSACTION

    async def scenario() -> None:
        batches = ack_batches.AckBatches(Any, Any, lambda error: None)  # type: ignore[arg-type]
        for index in range(bound + 3):
            batches.add(_ack(f"c-{index}"))
        await batches.settled()

    asyncio.run(scenario())
    assert [len(batch) for batch in recorder.batches] == [bound, 3]
    assert [c for batch in recorder.batches for c in batch] == [
        f"c-{index}" for index in range(bound + 3)
    ]


@pytest.mark.spec("HOST-RT-5")
def test_a_failed_transaction_is_handed_to_the_link_and_drops_what_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = _Recorder(fail_on="c-1")
    monkeypatch.setattr(link, "apply_acks", recorder.apply_acks)
    failures: list[BaseException] = []

    async def scenario() -> None:
        batches = ack_batches.AckBatches(Any, Any, failures.append)  # type: ignore[arg-type]
        batches.add(_ack("c-1"))
        await asyncio.sleep(0)
        batches.add(_ack("c-2"))
        recorder.release.set()
        await batches.settled()

    asyncio.run(scenario())
    assert recorder.batches == [["c-1"]]  # c-2 is delivered again on the next link
    assert [str(error) for error in failures] == ["the store refused the acknowledgements"]
