"""Delta normalization as properties (HOST-RT-2): replay reproduces every snapshot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_normalizer import DeltaNormalizer, PreAnchorBudget
from delta_normalizer.normalizer import replay

# Mixed-width text so UTF-8 offsets differ from code-point counts.
_TEXT = st.text(alphabet=st.sampled_from("ab é€😀\n"), max_size=12)


@st.composite
def _snapshot_sequences(draw: st.DrawFn) -> list[str]:
    """Cumulative snapshots: mostly growth, with duplicates and rewrites mixed in."""
    snapshots: list[str] = []
    current = ""
    for _ in range(draw(st.integers(1, 15))):
        move = draw(st.sampled_from(["grow", "grow", "grow", "same", "rewrite"]))
        if move == "grow":
            current += draw(_TEXT)
        elif move == "rewrite":
            current = draw(_TEXT)
        snapshots.append(current)
    return snapshots


@pytest.mark.spec("HOST-RT-2")
@given(_snapshot_sequences(), st.sampled_from(["text", "reasoning"]))
def test_text_replay_reproduces_every_snapshot(snapshots: list[str], target: str) -> None:
    normalizer = DeltaNormalizer()
    emitted = []
    previous: str | None = None
    for snapshot in snapshots:
        ops = normalizer.text("m1", snapshot, target=target)
        emitted += ops
        assert replay(emitted) == snapshot
        if previous is None:
            assert [op.operation for op in ops] == ["set"]
        elif snapshot == previous:
            assert ops == []  # duplicates produce nothing
        elif snapshot.startswith(previous):
            assert [op.operation for op in ops] == ["append_text"]
            assert ops[0].text == snapshot[len(previous) :]
        else:
            assert [op.operation for op in ops] == ["set"]  # rewrites produce set
        assert all(op.target == target and op.message_id == "m1" for op in ops)
        previous = snapshot


@pytest.mark.spec("HOST-RT-2")
@given(st.lists(_TEXT, min_size=1, max_size=20), st.integers(0, 20))
def test_tool_output_offsets_equal_the_prior_utf8_length(chunks: list[str], anchor_at: int) -> None:
    normalizer = DeltaNormalizer(PreAnchorBudget(max_calls=4, max_bytes=10_000))
    emitted = []
    sent = ""
    for index, chunk in enumerate(chunks):
        if index == anchor_at:
            emitted += normalizer.anchor("call-1")
        ops = normalizer.tool_output_chunk("call-1", chunk)
        if index < anchor_at:
            assert ops == []  # held before the anchor: nothing is emitted
        emitted += ops
        sent += chunk
    emitted += normalizer.anchor("call-1")
    for position, op in enumerate(emitted):
        assert op.message_id == "call-1"
        assert op.target == "tool_output"
        if position == 0:
            assert op.operation == "set"
        if op.operation == "append_text":
            prior = replay(emitted[:position])
            assert op.offset_bytes == len(prior.encode("utf-8"))
    assert replay(emitted) == sent


@pytest.mark.spec("HOST-RT-2")
@given(_snapshot_sequences())
def test_cumulative_tool_output_snapshots_replay(snapshots: list[str]) -> None:
    normalizer = DeltaNormalizer()
    normalizer.anchor("call-1")
    emitted = []
    for snapshot in snapshots:
        emitted += normalizer.tool_output("call-1", snapshot)
        assert replay(emitted) == snapshot


@pytest.mark.spec("HOST-RT-2")
def test_pre_anchor_buffer_is_bounded_and_never_invents_a_row() -> None:
    normalizer = DeltaNormalizer(PreAnchorBudget(max_calls=1, max_bytes=8))
    assert normalizer.tool_output_chunk("a", "1234") == []
    assert normalizer.tool_output_chunk("b", "x") == []  # a second call exceeds max_calls
    assert normalizer.tool_output_chunk("a", "56789") == []  # 9 bytes exceed max_bytes
    assert normalizer.tool_output_chunk("a", "0") == []  # a dropped prefix is not rebuilt
    assert normalizer.dropped == ["b", "a"]
    assert normalizer.pending_bytes() == 0
    assert normalizer.anchor("a") == []  # nothing held: nothing emitted
    ops = normalizer.tool_output_chunk("a", "z")
    assert [(op.operation, op.text) for op in ops] == [("set", "z")]
