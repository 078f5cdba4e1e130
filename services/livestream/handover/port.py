"""What the registry needs of a hand-over transport (the bus is behind it, SCALE-4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from services.livestream.handover.state import HandoverRequest, PublisherState

__all__ = ["HandoverTransport", "OwnerLost", "StateProvider"]


class OwnerLost(Exception):
    """Nobody answered for the epoch (no responders, or no answer in time).

    Its owner crashed, or the publisher was discarded; the device's resume is rejected.
    """


StateProvider = Callable[[HandoverRequest], PublisherState]
"""The owner's side: freeze the publisher the request names and return its state, or raise
:class:`~services.livestream.handover.state.HandoverRefused`."""


class HandoverTransport(Protocol):
    """Answers hand-over requests for the epochs this replica holds, and asks other replicas."""

    def announce(self, epoch: str) -> None:
        """Answer hand-over requests for ``epoch`` from now on."""

    def withdraw(self, epoch: str) -> None:
        """Stop answering for ``epoch``."""

    async def request(self, request: HandoverRequest, max_replay_bytes: int) -> PublisherState:
        """The state of the publisher holding ``request.epoch``, taken from its owner.

        Raises:
            OwnerLost: no owner answered.
            HandoverRefused: the owner refused, or what came back is not a valid state.
        """
        ...

    async def close(self) -> None:
        """Stop answering and disconnect."""
