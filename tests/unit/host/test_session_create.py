"""Pure parts of Session creation and deferred root settlement (HOST-SES-1, HOST-TURN-6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.host.sessions.commands import DERIVED_TITLE_LENGTH, derived_title
from services.host.turns.lifecycle import DeferredSettlement


@pytest.mark.spec("HOST-SES-1")
def test_a_title_is_derived_from_the_first_non_blank_line() -> None:
    assert derived_title("\n  Fix the login bug  \nand add a test") == "Fix the login bug"
    assert derived_title("   ") == ""
    long = "x" * 200
    title = derived_title(long)
    assert len(title) == DERIVED_TITLE_LENGTH
    assert title.endswith("\u2026")


@pytest.mark.spec("HOST-SES-1")
@given(st.text())
def test_a_derived_title_is_short_single_line_and_free_of_control_characters(text: str) -> None:
    title = derived_title(text)
    assert len(title) <= DERIVED_TITLE_LENGTH
    assert not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in title)


@pytest.mark.spec("HOST-TURN-6")
@given(
    st.sampled_from(["completed", "failed", "canceled", "interrupted"]),
    st.none() | st.text(),
    st.none() | st.text(min_size=1),
    st.integers(0, 2**53 - 1),
)
def test_a_deferred_settlement_round_trips(
    outcome: str, failure: str | None, result: str | None, at: int
) -> None:
    recorded = DeferredSettlement(outcome, failure, result, at)
    assert DeferredSettlement.from_json(recorded.to_json()) == recorded
