"""A stateful model of Interaction transitions over the real store (HOST-INT-1..3).

Hypothesis drives runtime reports, user responses, dispositions, settlements and runtime
loss against the domain on both backends and checks after every step that no
Interaction ever returns to ``pending``, a terminal status never changes, a conflict
commits nothing and only pending Interactions of unsettled Turns are actionable.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from sqlalchemy import insert, select

from domainerrors import DomainError
from services.host.context import HostContext
from services.host.runtime import link
from services.host.runtime.registry import RuntimeIdentity
from services.host.runtime.reports import (
    ReportItem,
    ReportVerdict,
    RuntimeReportInput,
    TurnPatchItem,
)
from services.host.turns import interactions
from services.host.turns.interactions import DispositionInput, ResponseRequest, TransitionInput
from services.host.wire.command_codec import ProtoCommandCodec
from store.database import Database
from store.models import Interaction, InteractionResponseOperation, Session, Turn

TERMINAL = {"answered", "superseded", "interrupted"}
TURNS = ("t1", "t2")
REQUESTS = ("q1", "q2")
T = TypeVar("T")
IDENTITY = RuntimeIdentity("rt", "i1", frozenset({"demo"}), frozenset(), {}, frozenset({"*"}))


def _machine(url: str) -> type[RuleBasedStateMachine]:
    class InteractionModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.database = Database(url)
            self.loop.run_until_complete(self.database.start())
            self.ctx = HostContext(database=self.database, command_codec=ProtoCommandCodec())
            self.session_id = f"s-{uuid.uuid4().hex[:8]}"
            self.history: dict[tuple[str, str], list[str]] = {}
            self.reports = 0
            self.run(self._seed())

        def run(self, awaitable: Coroutine[Any, Any, T]) -> T:
            return self.loop.run_until_complete(awaitable)

        async def _seed(self) -> None:
            async with self.database.engine.begin() as connection:
                await connection.execute(
                    insert(Session).values(
                        workspace_id="ws-1",
                        session_id=self.session_id,
                        root_session_id=self.session_id,
                        provider="demo",
                        rail_section_key="conversations",
                        created_at_unix_ms=1,
                        updated_at_unix_ms=1,
                    )
                )
            for turn_id in TURNS:
                await self._report(TurnPatchItem(turn_id, "running", origin="user"))

        async def _report(self, *items: ReportItem) -> ReportVerdict:
            self.reports += 1
            return await link.apply_report(
                self.ctx,
                IDENTITY,
                RuntimeReportInput(f"r{self.reports}", "ws-1", self.session_id, tuple(items)),
            )

        async def _rows(self) -> tuple[list[Interaction], dict[str, str]]:
            async with self.database.engine.connect() as connection:
                rows = (
                    await connection.execute(
                        select(Interaction).where(Interaction.session_id == self.session_id)
                    )
                ).all()
                turns = (
                    await connection.execute(
                        select(Turn.turn_id, Turn.phase).where(Turn.session_id == self.session_id)
                    )
                ).all()
            return list(rows), {t[0]: t[1] for t in turns}  # type: ignore[arg-type]

        @rule(
            turn=st.sampled_from(TURNS),
            request=st.sampled_from(REQUESTS),
            status=st.sampled_from(["pending", "superseded", "answered", "resolving"]),
            changed=st.booleans(),
        )
        def transition(self, turn: str, request: str, status: str, changed: bool) -> None:
            before = self.run(self._rows())
            verdict = self.run(
                self._report(
                    TransitionInput(
                        turn,
                        request,
                        status,
                        "permission",
                        "Bash",
                        '{"changed": true}' if changed else "{}",
                        "{}",
                        "t",
                        "s",
                        None,
                        1,
                    )
                )
            )
            if verdict.outcome in ("conflict", "rejected"):
                assert self.run(self._rows()) == before  # nothing from the report committed
            if status not in ("pending", "superseded"):
                assert verdict.outcome == "rejected"

        @rule(
            turn=st.sampled_from(TURNS),
            request=st.sampled_from(REQUESTS),
            key=st.sampled_from("ab"),
        )
        def respond(self, turn: str, request: str, key: str) -> None:
            with contextlib.suppress(DomainError):
                self.run(
                    interactions.submit_response(
                        self.ctx,
                        ResponseRequest(
                            "ws-1",
                            self.session_id,
                            turn,
                            request,
                            "allow",
                            None,
                            None,
                            f"{self.session_id}-{key}",
                        ),
                    )
                )

        @rule(
            status=st.sampled_from(
                ["pending", "resolving", "answered", "superseded", "interrupted"]
            )
        )
        def disposition(self, status: str) -> None:
            async def operations() -> list[InteractionResponseOperation]:
                async with self.database.engine.connect() as connection:
                    query = select(InteractionResponseOperation).where(
                        InteractionResponseOperation.session_id == self.session_id
                    )
                    return list((await connection.execute(query)).all())  # type: ignore[arg-type]

            for op in self.run(operations()):
                self.run(
                    self._report(
                        DispositionInput(
                            op.operation_id, "", op.turn_id, op.request_id, status, None
                        )
                    )
                )

        @rule(turn=st.sampled_from(TURNS), outcome=st.sampled_from(["completed", "canceled"]))
        def settle(self, turn: str, outcome: str) -> None:
            self.run(self._report(TurnPatchItem(turn, "settled", outcome=outcome)))

        @rule()
        def lose_runtime(self) -> None:
            self.run(link.runtime_lost(self.ctx, IDENTITY, include_served_by_others=True))

        @invariant()
        def statuses_only_move_forward(self) -> None:
            rows, turns = self.run(self._rows())
            for row in rows:
                key = (row.turn_id, row.request_id)
                seen = self.history.setdefault(key, [])
                if seen:
                    last = seen[-1]
                    if last in TERMINAL:
                        assert row.status == last, f"{key}: terminal {last} -> {row.status}"
                    if last != "pending":
                        assert row.status != "pending", f"{key}: {last} -> pending"
                seen.append(row.status)
                if row.actionable and row.status == "pending":
                    assert turns[row.turn_id] != "settled"
                if turns[row.turn_id] == "settled":
                    assert row.status in TERMINAL or not row.actionable

        def teardown(self) -> None:
            self.run(self.database.stop())
            self.loop.close()

    return InteractionModel


@pytest.mark.spec("HOST-INT-1", "HOST-INT-2", "HOST-INT-3")
def test_interaction_transitions_never_return_to_pending(migrated_db_url: str) -> None:
    run_state_machine_as_test(
        _machine(migrated_db_url),
        settings=settings(max_examples=15, stateful_step_count=12, deadline=None),
    )
