"""An adopted publisher continues Host's feed exactly where its old owner stopped (SCALE-4).

Two registries (the old owner and the adopter) read one modelled Host log: committed
events with increasing ids, served after a cursor like ``WatchActivity``. Events committed
while nobody holds the publisher must reach it exactly once after the hand-over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from agentactivity.host.v1 import activity_pb2
from agentactivity.livestream.v1 import livestream_pb2
from grpcserver.auth import Principal, Role
from services.livestream.handover.state import FORMAT_VERSION, HandoverRequest
from services.livestream.publisher import Publisher
from services.livestream.registry import PublisherRegistry
from services.livestream.settings import Settings
from services.livestream.source import Baseline, WatchItem

WS = "ws-1"
Reason = livestream_pb2.DiscontinuityReason


class HostLog:
    """Committed events of one workspace, watched after a cursor (as Host serves them)."""

    def __init__(self) -> None:
        self.events: list[activity_pb2.ActivityEvent] = []
        self.watches: list[int | None] = []
        self._changed = asyncio.Condition()

    async def commit(self, count: int) -> None:
        async with self._changed:
            for _ in range(count):
                n = len(self.events) + 1
                self.events.append(
                    activity_pb2.ActivityEvent(
                        event_id=10 * n,
                        workspace_id=WS,
                        workspace_sequence=n,
                        session_reconcile_required=activity_pb2.SessionReconcileRequiredEvent(
                            session_id=f"s{n}"
                        ),
                    )
                )
            self._changed.notify_all()

    async def watch(
        self, workspace_id: str, after_event_id: int | None
    ) -> AsyncIterator[WatchItem]:
        self.watches.append(after_event_id)
        head = self.events[-1].event_id if self.events else 0
        yield activity_pb2.ActivityStreamReady(workspace_id=workspace_id, head_event_id=head)
        position = head if after_event_id is None else after_event_id
        while True:
            for event in [e for e in self.events if e.event_id > position]:
                position = event.event_id
                yield event
            async with self._changed:
                await self._changed.wait_for(self._past(position))

    def _past(self, position: int) -> Callable[[], bool]:
        return lambda: bool(self.events) and self.events[-1].event_id > position

    async def read_baseline(self, workspace_id: str, session_id: str) -> Baseline:
        raise NotImplementedError

    async def close(self) -> None:
        return None


PRINCIPAL = Principal(subject="ws1-device", role=Role.DEVICE, workspaces=frozenset({WS}))


def _sessions(publisher: Publisher, after: int = 0) -> list[str]:
    out = []
    for entry in publisher.buffer.after(after):
        delivery = livestream_pb2.Delivery.FromString(entry)
        if delivery.discontinuity.reason == Reason.DISCONTINUITY_REASON_SESSION_RECONCILE_REQUIRED:
            out.append(delivery.discontinuity.keys.session_id)
    return out


async def _until(predicate: Callable[[], bool]) -> None:
    """Let the loop run until ``predicate`` holds (at most about 5 s)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def _ends_with(publisher: Publisher, sessions: list[str]) -> Callable[[], bool]:
    return lambda: _sessions(publisher)[-len(sessions) :] == sessions


def _request(publisher: Publisher, last_sequence: int) -> HandoverRequest:
    return HandoverRequest(
        v=FORMAT_VERSION,
        principal=publisher.key.principal,
        device_id=publisher.key.device_id,
        workspace_ids=publisher.key.workspace_ids,
        epoch=publisher.epoch,
        last_sequence=last_sequence,
    )


@pytest.mark.spec("SCALE-4", "LIVE-UP-1")
def test_events_committed_during_the_hand_over_reach_the_adopted_publishers_once() -> None:
    async def scenario() -> None:
        host = HostLog()
        owner = PublisherRegistry(Settings(), host)
        adopter = PublisherRegistry(Settings(), host)
        phones = [owner.publisher_for(PRINCIPAL, f"phone-{n}", [WS]) for n in range(2)]
        await _until(lambda: owner.feeds[WS].ready)
        await host.commit(3)
        await _until(lambda: all(_sessions(p) == ["s1", "s2", "s3"] for p in phones))

        # The first device moves; Host commits while the second is still on the owner.
        first = owner.hand_over(_request(phones[0], 0))
        assert first.positions == {WS: 30}
        await host.commit(2)
        await _until(lambda: _sessions(phones[1]) == ["s1", "s2", "s3", "s4", "s5"])
        adopted = [adopter.adopt(PRINCIPAL, first)]
        await host.commit(1)
        await _until(lambda: len(_sessions(phones[1])) == 6)
        # The second leaves the owner later, from a later position.
        second = owner.hand_over(_request(phones[1], 0))
        assert second.positions == {WS: 60}
        adopted.append(adopter.adopt(PRINCIPAL, second))
        await host.commit(2)

        want = [f"s{n}" for n in range(1, 9)]
        await _until(lambda: all(_sessions(p) == want for p in adopted))
        await asyncio.sleep(0.05)  # a duplicate would have arrived by now
        for publisher in adopted:
            assert _sessions(publisher) == want
            sequences = [
                livestream_pb2.Delivery.FromString(e).sequence for e in publisher.buffer.after(0)
            ]
            assert sequences == list(
                range(publisher.buffer.oldest_sequence or 1, publisher.latest_sequence + 1)
            )
        # The feed started at 30 had delivered through 60 when the second came: it joined
        # that feed, so the hand-over cost one Host subscription.
        assert [w for w in host.watches if w is not None] == [30]
        await owner.stop()
        await adopter.stop()

    asyncio.run(scenario())


@pytest.mark.spec("SCALE-4")
def test_publishers_handed_over_from_one_position_share_one_host_subscription() -> None:
    async def scenario() -> None:
        host = HostLog()
        owner = PublisherRegistry(Settings(), host)
        adopter = PublisherRegistry(Settings(), host)
        phones = [owner.publisher_for(PRINCIPAL, f"phone-{n}", [WS]) for n in range(3)]
        await _until(lambda: owner.feeds[WS].ready)
        await host.commit(2)
        await _until(lambda: all(len(_sessions(p)) == 2 for p in phones))
        states = [owner.hand_over(_request(p, 0)) for p in phones]
        assert {s.positions[WS] for s in states} == {20}
        await host.commit(1)
        first = adopter.adopt(PRINCIPAL, states[0])
        await _until(lambda: _sessions(first)[-1:] == ["s3"])
        await host.commit(1)
        later = [adopter.adopt(PRINCIPAL, s) for s in states[1:]]
        await host.commit(1)
        for publisher in [first, *later]:
            await _until(_ends_with(publisher, ["s3", "s4", "s5"]))
            assert _sessions(publisher) == ["s1", "s2", "s3", "s4", "s5"]
        assert [w for w in host.watches if w is not None] == [20]
        assert len(adopter.handover_feeds) == 1
        await owner.stop()
        await adopter.stop()

    asyncio.run(scenario())
