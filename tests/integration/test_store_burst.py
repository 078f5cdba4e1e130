"""A burst of 700 concurrent ``CreateSession`` calls on one machine all succeed (CON-5, OPS-3).

A real Host process on the default settings; the calls come from one asyncio client at once.
On SQLite they wait in the process's write queue (first come, first served) instead of failing
after SQLite's 5 s busy timeout; on Postgres they share the connection pool.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import grpc
import pytest
from sqlalchemy import Engine, func, select

from agentactivity.host.v1 import host_pb2, host_pb2_grpc
from store.models import Session
from tests.support.host_sessions import ADMIN, WS1, demo_target
from tests.support.service_process import service_process

pytestmark = pytest.mark.slow

BURST = 700


async def _burst(address: str) -> collections.Counter[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = host_pb2_grpc.HostServiceStub(channel)
        await stub.RegisterAgentTarget(
            host_pb2.RegisterAgentTargetRequest(target=demo_target()), metadata=ADMIN, timeout=30
        )

        async def create(i: int) -> str:
            try:
                await stub.CreateSession(
                    host_pb2.CreateSessionRequest(
                        workspace_id="ws-1",
                        agent_target_id="demo",
                        session_id=f"s-{i:04d}",
                        title=f"burst {i}",
                        cwd="/work/app",
                    ),
                    metadata=WS1,
                    timeout=120,
                )
            except grpc.aio.AioRpcError as error:
                return f"{error.code().name}: {error.details()}"
            return "OK"

        return collections.Counter(await asyncio.gather(*(create(i) for i in range(BURST))))


@pytest.mark.spec("CON-5", "HOST-SES-1")
def test_700_concurrent_create_session_calls_all_succeed(
    tmp_path: Path, migrated_db_url: str, sync_engine: Engine
) -> None:
    with service_process("host", tmp_path, database_url=migrated_db_url) as host:
        outcomes = asyncio.run(_burst(host.address))
    assert outcomes == {"OK": BURST}
    with sync_engine.connect() as connection:
        stored = connection.execute(select(func.count()).select_from(Session)).scalar_one()
    assert stored == BURST
