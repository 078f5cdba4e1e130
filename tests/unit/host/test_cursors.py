"""The 2^53-1 cursor bound (CON-4): emitted values are checked, request values validated."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domainerrors import InvalidArgument, OutOfRange
from services.host.model.cursor_bounds import (
    CURSOR_BOUND_EXCEEDED,
    INVALID_CURSOR,
    MAX_CURSOR,
    checked_cursor,
    parse_cursor_argument,
)

pytestmark = pytest.mark.spec("CON-4")


def test_the_bound_is_the_largest_exact_double_integer() -> None:
    assert MAX_CURSOR == 9_007_199_254_740_991
    assert float(MAX_CURSOR) == MAX_CURSOR
    assert float(MAX_CURSOR + 1) == float(MAX_CURSOR + 2)  # beyond it doubles lose integers


@pytest.mark.parametrize("value", [0, 1, MAX_CURSOR])
def test_values_in_range_pass_unchanged(value: int) -> None:
    assert checked_cursor(value, field="version") == value
    assert parse_cursor_argument(value, field="after_version") == value


@pytest.mark.parametrize("value", [MAX_CURSOR + 1, 2**63 - 1, -1])
def test_a_stored_value_beyond_the_bound_fails_the_response(value: int) -> None:
    with pytest.raises(OutOfRange) as raised:
        checked_cursor(value, field="message_version")
    assert raised.value.reason == CURSOR_BOUND_EXCEEDED
    assert raised.value.metadata["field"] == "message_version"
    assert raised.value.status == "OUT_OF_RANGE"


@pytest.mark.parametrize("value", [MAX_CURSOR + 1, -5])
def test_a_request_cursor_beyond_the_bound_is_invalid_argument(value: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_cursor_argument(value, field="before_version")
    assert raised.value.reason == INVALID_CURSOR
    assert [v.field for v in raised.value.field_violations] == ["before_version"]


def test_non_integers_are_programming_errors() -> None:
    with pytest.raises(TypeError):
        checked_cursor(True, field="version")
    with pytest.raises(TypeError):
        parse_cursor_argument(1.0, field="version")  # type: ignore[arg-type]


@given(st.integers())
def test_checked_cursor_never_returns_a_value_beyond_the_bound(value: int) -> None:
    try:
        result = checked_cursor(value, field="sequence")
    except OutOfRange:
        assert not 0 <= value <= MAX_CURSOR
    else:
        assert result == value
        assert 0 <= result <= MAX_CURSOR
