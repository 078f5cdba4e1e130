"""The advertised ``max_report_bytes`` and Host's receive limit agree (SEC-4, HOST-RT-1).

Real reports of 5 MiB and 9 MiB go over a real socket: the first is read and applied (gRPC's
default 4 MiB receive limit would have ended the link with ``RESOURCE_EXHAUSTED``), the
second is a typed ``REPORT_OUTCOME_REJECTED`` ``REPORT_TOO_LARGE`` for that report alone,
and the link stays up.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentactivity.canonical.v1 import canonical_pb2
from agentactivity.host.v1 import runtime_pb2
from services.host.app import RECEIVE_LIMIT_BYTES
from services.host.runtime.link import MAX_REPORT_BYTES
from tests.integration.host_activity import WS, start_host
from tests.support.runtime_client import text_message, turn_patch
from tests.support.servers import LiveServer

MIB = 1024 * 1024
TEXT_BYTES = 900_000
"""Each message's text: under the 1 MiB message field bound, so only the total is large."""


def _messages(turn_id: str, prefix: str, total_bytes: int) -> list[runtime_pb2.ReportItem]:
    count = -(-total_bytes // TEXT_BYTES)
    return [text_message(f"{prefix}{n}", turn_id, "x" * TEXT_BYTES) for n in range(count)]


@pytest.mark.spec("SEC-4", "HOST-RT-1")
def test_reports_of_5_and_9_mib_are_answered_as_reports(
    migrated_db_url: str, live_server: Callable[..., LiveServer]
) -> None:
    assert RECEIVE_LIMIT_BYTES > 9 * MIB > MAX_REPORT_BYTES > 5 * MIB
    host = start_host(live_server, migrated_db_url)
    runtime = host.runtime()
    assert runtime.welcome is not None
    assert runtime.welcome.max_report_bytes == MAX_REPORT_BYTES
    turn = host.send("hello", "c1").turn
    runtime.ack(runtime.next_command().command_id)
    running = runtime.report(
        WS, "s1", "r0", turn_patch(turn.turn_id, canonical_pb2.TURN_PHASE_RUNNING)
    )
    assert running.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    turns_before, messages_before = host.counts()

    five = _messages(turn.turn_id, "five-", 5 * MIB)
    report = runtime_pb2.RuntimeReport(report_id="r5", workspace_id=WS, session_id="s1", items=five)
    assert 5 * MIB < report.ByteSize() < MAX_REPORT_BYTES
    applied = runtime.report(WS, "s1", "r5", *five)
    assert applied.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED, applied
    assert host.counts() == (turns_before, messages_before + len(five))

    nine = _messages(turn.turn_id, "nine-", 9 * MIB)
    report = runtime_pb2.RuntimeReport(report_id="r9", workspace_id=WS, session_id="s1", items=nine)
    assert MAX_REPORT_BYTES < 9 * MIB < report.ByteSize() < RECEIVE_LIMIT_BYTES
    rejected = runtime.report(WS, "s1", "r9", *nine)
    assert (rejected.outcome, rejected.reason) == (
        runtime_pb2.REPORT_OUTCOME_REJECTED,
        "REPORT_TOO_LARGE",
    )
    assert host.counts() == (turns_before, messages_before + len(five))

    # The link is still up: the next report is applied.
    after = runtime.report(WS, "s1", "r10", text_message("small", turn.turn_id, "done"))
    assert after.outcome == runtime_pb2.REPORT_OUTCOME_APPLIED
    runtime.close()
    assert runtime.error is None
