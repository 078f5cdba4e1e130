"""Opaque page tokens are bound to the listing that issued them (REF-BACKEND-1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import page_tokens


@pytest.mark.spec("REF-BACKEND-1")
@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.none() | st.text(max_size=20)),
    st.lists(st.none() | st.integers() | st.text(max_size=20), max_size=3),
)
def test_round_trip_and_binding(binding: dict[str, str | None], position: list[object]) -> None:
    token = page_tokens.encode(binding, position)
    assert page_tokens.decode(token, binding) == position
    with pytest.raises(page_tokens.MalformedPageToken):
        page_tokens.decode(token, {**binding, "other": "x"})


@pytest.mark.spec("REF-BACKEND-1")
@pytest.mark.parametrize("token", ["", "!!!", "bm90IGpzb24", "e30", "W10"])
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(page_tokens.MalformedPageToken):
        page_tokens.decode(token, {})
