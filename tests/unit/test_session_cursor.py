"""Value cursors of the Session listings (HOST-SES-4, SEC-1): pure logic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domainerrors import InvalidArgument
from services.host.model.listing_cursors import CursorPosition, decode_cursor, encode_cursor


@pytest.mark.spec("HOST-SES-4")
@given(
    workspace=st.text(min_size=1, max_size=40),
    listing=st.text(min_size=1, max_size=40),
    updated=st.integers(min_value=0, max_value=2**63 - 1),
    session_id=st.text(max_size=128),
)
def test_a_cursor_round_trips(workspace: str, listing: str, updated: int, session_id: str) -> None:
    position = CursorPosition(updated, session_id)
    token = encode_cursor(workspace, listing, position)
    assert decode_cursor(token, workspace, listing) == position


def _reason(call: object) -> str:
    with pytest.raises(InvalidArgument) as caught:
        call()  # type: ignore[operator]
    assert [v.field for v in caught.value.field_violations] == ["cursor"]
    return caught.value.reason


@pytest.mark.spec("HOST-SES-4", "SEC-1")
def test_cursors_are_bound_to_workspace_and_listing() -> None:
    token = encode_cursor("ws-1", "pinned", CursorPosition(5, "s-1"))
    assert _reason(lambda: decode_cursor(token, "ws-2", "pinned")) == "INVALID_CURSOR"
    assert _reason(lambda: decode_cursor(token, "ws-1", "search")) == "INVALID_CURSOR"


@pytest.mark.spec("HOST-SES-4", "SEC-2")
@pytest.mark.parametrize("token", ["", "garbage", "c1.", "c1.!!!!", "c1." + "A" * 5000])
def test_foreign_or_corrupt_tokens_are_invalid_cursors(token: str) -> None:
    assert _reason(lambda: decode_cursor(token, "ws-1", "pinned")) == "INVALID_CURSOR"


@pytest.mark.spec("HOST-SES-4")
def test_an_altered_cursor_is_rejected() -> None:
    token = encode_cursor("ws-1", "pinned", CursorPosition(5, "s-1"))
    flipped = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    assert _reason(lambda: decode_cursor(flipped, "ws-1", "pinned")) == "INVALID_CURSOR"
