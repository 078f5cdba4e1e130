"""A draining Host ends its long-lived streams at once instead of waiting out the grace (OPS-3).

``WatchActivity`` and ``RuntimeLink`` never finish by themselves, so without the drain hooks a
SIGTERM would hold the process for the whole grace period and then cut the streams with
``CANCELLED``. With them, both end with ``UNAVAILABLE`` (reason ``DRAINING``) as soon as new
RPCs are refused, and the process exits 0 well inside its grace.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from tests.support.activity_watch import Watcher
from tests.support.rpc_errors import error_details
from tests.support.runtime_client import ScriptedRuntime
from tests.support.service_process import service_process

pytestmark = pytest.mark.slow

GRACE_SECONDS = 20.0


def _reason(error: grpc.RpcError) -> str:
    return error_details(error)[1]


@pytest.mark.spec("OPS-3", "ARCH-4", "HOST-OBS-2", "HOST-RT-1")
def test_sigterm_ends_watches_and_runtime_links_with_draining_and_exits_fast(
    tmp_path: Path, migrated_db_url: str
) -> None:
    with (
        service_process(
            "host",
            tmp_path,
            database_url=migrated_db_url,
            grace_period_seconds=str(GRACE_SECONDS),
            drain_delay_seconds="0.2",
        ) as host,
        grpc.insecure_channel(host.address) as channel,
    ):
        watcher = Watcher(channel, "ws-1")
        watcher.wait_ready()
        runtime = ScriptedRuntime(channel, runtime_id="rt-drain")
        assert runtime.welcome is not None
        signalled = time.monotonic()
        host.process.send_signal(signal.SIGTERM)

        watcher.wait_done(timeout=GRACE_SECONDS)
        assert watcher.error is not None, "the watch did not end"
        assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE, watcher.error
        assert _reason(watcher.error) == "DRAINING"

        ended = runtime.next_frame(timeout=GRACE_SECONDS)
        assert isinstance(ended, grpc.RpcError), ended
        assert ended.code() == grpc.StatusCode.UNAVAILABLE, ended
        assert _reason(ended) == "DRAINING"

        assert host.process.wait(timeout=GRACE_SECONDS) == 0
        # Far inside the grace: the streams did not hold the drain.
        assert time.monotonic() - signalled < GRACE_SECONDS / 2
