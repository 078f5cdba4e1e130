"""The live log's pure parts: subject tokens, the cursor rule, codecs, settings (SCALE-3)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from livelog.codec import ItemDecodeError, ProtobufCodec
from livelog.cursor import start_after
from livelog.factory import open_live_log
from livelog.inprocess import InProcessLiveLog
from livelog.interface import DiscontinuityReason, InvalidWorkspace, LogPosition
from livelog.settings import LiveLogSettings
from livelog.subjects import workspace_subject, workspace_token

pytestmark = [pytest.mark.spec("SCALE-3")]

_NATS_SPECIAL = set(".*> \t\r\n")


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_workspace_tokens_are_injective_subject_tokens(first: str, second: str) -> None:
    token = workspace_token(first)
    assert not _NATS_SPECIAL & set(token)
    assert token.isascii()
    if first != second:
        assert token != workspace_token(second)


def test_readable_ids_stay_readable_and_others_are_escaped() -> None:
    assert workspace_subject("tutti.live", "local") == "tutti.live.local"
    assert workspace_token("team-7_a") == "team-7_a"
    assert workspace_token("a.b") == "a~2Eb"
    assert workspace_token("a~2Eb") == "a~7E2Eb"
    assert workspace_token("é>") == "~C3~A9~3E"
    with pytest.raises(InvalidWorkspace):
        workspace_token("")


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (None, (None, 11)),
        (LogPosition("e", 10), (None, 11)),
        (LogPosition("e", 4), (None, 5)),
        (LogPosition("e", 3), (DiscontinuityReason.CURSOR_EVICTED, 5)),
        (LogPosition("e", 0), (DiscontinuityReason.CURSOR_EVICTED, 5)),
        (LogPosition("e", 11), (DiscontinuityReason.CURSOR_AHEAD, 11)),
        (LogPosition("old", 7), (DiscontinuityReason.EPOCH_CHANGED, 5)),
    ],
)
def test_the_cursor_rule(
    after: LogPosition | None, expected: tuple[DiscontinuityReason | None, int]
) -> None:
    """Retained range 5..10 of epoch ``e``."""
    assert start_after(after, epoch="e", first_sequence=5, last_sequence=10) == expected


def test_an_empty_log_accepts_cursor_zero_exactly() -> None:
    assert start_after(LogPosition("e", 0), epoch="e", first_sequence=1, last_sequence=0) == (
        None,
        1,
    )


def test_protobuf_codec_round_trips_and_refuses_garbage() -> None:
    codec = ProtobufCodec(Timestamp)
    stamp = Timestamp(seconds=12, nanos=34)
    assert codec.decode(codec.encode(stamp)) == stamp
    with pytest.raises(ItemDecodeError):
        codec.decode(b"\xff\xff\xff")


def test_the_default_bus_is_in_process_and_nats_is_chosen_by_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = LiveLogSettings()
    assert default.bus == "inprocess"
    log = asyncio.run(open_live_log(default, ProtobufCodec(Timestamp)))
    assert isinstance(log, InProcessLiveLog)

    monkeypatch.setenv("TUTTI_BUS", "nats")
    monkeypatch.setenv("TUTTI_NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("TUTTI_LIVE_LOG_MAX_MSGS", "42")
    configured = LiveLogSettings()
    assert (configured.bus, configured.nats_url, configured.live_log_max_msgs) == (
        "nats",
        "nats://10.0.0.1:4222",
        42,
    )
    monkeypatch.setenv("TUTTI_LIVE_LOG_STREAM", "bad.name")
    with pytest.raises(ValueError, match="live_log_stream"):
        LiveLogSettings()


@pytest.mark.spec("OPS-1")
def test_every_live_log_setting_is_documented() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [
        f"TUTTI_{name.upper()}"
        for name in LiveLogSettings.model_fields
        if f"`TUTTI_{name.upper()}`" not in text
    ]
    assert not missing
