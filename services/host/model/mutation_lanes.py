"""Per-Session mutation lanes (HOST-LANE-1).

Activation/resume, ``UpdateSessionSettings``, ``StopTurn`` and delete quiescing of one
Session run one at a time, in arrival order, so none can interleave with another. Lanes
live in the host process (each replica serializes its own callers; the Session row lock
orders transactions across replicas); a lane is dropped as soon as nobody holds or waits
for it, so memory does not grow with history.

A runtime's reports also apply in the lane (their commands go out in commit order with the
others'), with one exception: a holder that waits for a runtime's acknowledgement
(activation, live settings) **lends** the lane to reports while it waits
(:meth:`MutationLanes.lend_to_reports`). A runtime sends its frames in order on one link,
and Host applies them in that order, so a report the runtime sent before the awaited
acknowledgement must apply before Host can even read the acknowledgement; without the loan
the holder and the link would wait for each other until the holder's timeout. The holder is
suspended during the loan and has committed everything it wrote so far, so a report (one
transaction) applied then interleaves with none of its steps; the other lifecycle mutations
still wait for the holder to finish.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

SessionKey = tuple[str, str]
"""``(workspace_id, session_id)``."""


@dataclass(eq=False)
class _Waiter:
    report: bool
    granted: asyncio.Future[bool]
    """Resolves to whether the lane was granted on a loan (``True``) or outright."""


@dataclass(eq=False)
class _Lane:
    queue: deque[_Waiter] = field(default_factory=deque)
    held: bool = False
    lent: bool = False
    borrowed: asyncio.Event | None = None
    """Set while a report runs on the loan; the event fires when it is done."""
    users: int = 0


class MutationLanes:
    """One FIFO lane per Session, created on demand and released when idle."""

    def __init__(self) -> None:
        self._lanes: dict[SessionKey, _Lane] = {}

    @asynccontextmanager
    async def hold(self, workspace_id: str, session_id: str) -> AsyncIterator[None]:
        """Run the body exclusively for this Session."""
        async with self._enter((workspace_id, session_id), report=False):
            yield

    @asynccontextmanager
    async def hold_for_report(self, workspace_id: str, session_id: str) -> AsyncIterator[None]:
        """Apply a runtime's report in this Session's lane, or on the lane's loan."""
        async with self._enter((workspace_id, session_id), report=True):
            yield

    @asynccontextmanager
    async def lend_to_reports(self, workspace_id: str, session_id: str) -> AsyncIterator[None]:
        """While the body runs, reports of the Session may apply, one at a time, in order.

        Only the lane's holder may lend it (it waits for its runtime in the body). On exit
        the holder waits for a report running on the loan to finish, then has the lane to
        itself again.
        """
        lane = self._lanes.get((workspace_id, session_id))
        if lane is None or not lane.held:
            raise RuntimeError(f"lane of {workspace_id}/{session_id} lent by a non-holder")
        lane.lent = True
        self._grant(lane)
        try:
            yield
        finally:
            lane.lent = False
            while lane.borrowed is not None:
                await asyncio.shield(lane.borrowed.wait())

    @asynccontextmanager
    async def hold_many(self, keys: Iterable[SessionKey]) -> AsyncIterator[None]:
        """Hold several lanes at once (delete quiescing), in a fixed order to avoid deadlock."""
        async with AsyncExitStack() as stack:
            for workspace_id, session_id in sorted(set(keys)):
                await stack.enter_async_context(self.hold(workspace_id, session_id))
            yield

    def active(self) -> int:
        """Number of Sessions with a holder or waiter (for tests and metrics)."""
        return len(self._lanes)

    @asynccontextmanager
    async def _enter(self, key: SessionKey, *, report: bool) -> AsyncIterator[None]:
        lane = self._lanes.setdefault(key, _Lane())
        lane.users += 1
        try:
            waiter = _Waiter(report, asyncio.get_running_loop().create_future())
            lane.queue.append(waiter)
            self._grant(lane)
            try:
                on_loan = await waiter.granted
            except asyncio.CancelledError:
                if waiter.granted.done() and not waiter.granted.cancelled():
                    self._leave(lane, waiter.granted.result())  # granted as it was cancelled
                elif waiter in lane.queue:
                    lane.queue.remove(waiter)
                raise
            try:
                yield
            finally:
                self._leave(lane, on_loan)
        finally:
            lane.users -= 1
            if lane.users == 0:
                del self._lanes[key]

    def _grant(self, lane: _Lane) -> None:
        """Let the next waiter in: the head when the lane is free, a report on a loan."""
        # A waiter cancelled while queued leaves the queue when its task resumes; skip it.
        if lane.borrowed is not None and not lane.lent:
            return  # a holder cancelled in its loan left: the report on the loan ends first
        if not lane.held:
            for waiter in lane.queue:
                if not waiter.granted.done():
                    lane.queue.remove(waiter)
                    lane.held = True
                    waiter.granted.set_result(False)
                    return
            return
        if lane.lent and lane.borrowed is None:
            for waiter in lane.queue:
                if waiter.report and not waiter.granted.done():
                    lane.queue.remove(waiter)
                    lane.borrowed = asyncio.Event()
                    waiter.granted.set_result(True)
                    return

    def _leave(self, lane: _Lane, on_loan: bool) -> None:
        if on_loan:
            assert lane.borrowed is not None
            lane.borrowed.set()
            lane.borrowed = None
        else:
            lane.held = False
        self._grant(lane)
