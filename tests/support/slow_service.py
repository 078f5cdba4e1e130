"""A real server process on the shared bootstrap with one slow RPC (drain tests).

Run as ``python -m tests.support.slow_service PORT_FILE``; settings come from the
``TUTTI_*`` environment like any service. The RPC ``tutti.test.v1.SlowService/Sleep``
takes raw bytes (seconds to sleep, as text) and answers ``b"done"``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc

from grpcserver.app import RunningServer, ServiceDefinition, serve
from grpcserver.settings import ServerSettings

SERVICE = "tutti.test.v1.SlowService"


async def _sleep(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(float(request.decode() or "1"))
    return b"done"


def build() -> ServiceDefinition:
    """The slow test service."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Sleep": grpc.unary_unary_rpc_method_handler(_sleep)}
    )
    return ServiceDefinition(
        name="slowtest",
        service_names=[SERVICE],
        register=lambda server: server.add_generic_rpc_handlers([handler]),
    )


def main() -> int:
    """Serve until SIGTERM; write the bound port to ``argv[1]``."""
    port_file = Path(sys.argv[1])

    def ready(running: RunningServer) -> None:
        port_file.write_text(str(running.port))

    return asyncio.run(serve(build(), ServerSettings(), ready=ready))


if __name__ == "__main__":
    raise SystemExit(main())
