"""A real server process on the shared bootstrap with one slow RPC (drain tests).

Run as ``python -m tests.support.slow_service PORT_FILE [SIGNAL_DIR]``; settings come from
the ``TUTTI_*`` environment like any service. The RPC ``tutti.test.v1.SlowService/Sleep``
takes raw bytes and answers ``b"done"``: seconds to sleep, as text, or ``b"release"`` to
wait until the file ``SIGNAL_DIR/release`` exists. With ``SIGNAL_DIR`` the handler makes
itself observable: once it has started it writes ``SIGNAL_DIR/started`` (its request), so a
test knows the RPC is in flight instead of guessing.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import grpc

from grpcserver.app import RunningServer, ServiceDefinition, serve
from grpcserver.authorization import ANY_ROLE, deployment_read
from grpcserver.settings import ServerSettings

SERVICE = "tutti.test.v1.SlowService"
STARTED = "started"
"""Written in ``SIGNAL_DIR`` by a handler that has started."""
RELEASE = "release"
"""The request that waits for ``SIGNAL_DIR/release``, and that file's name."""


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def build(signal_dir: Path | None = None) -> ServiceDefinition:
    """The slow test service; ``signal_dir`` receives its markers."""

    async def sleep(request: bytes, context: Any) -> bytes:
        text = request.decode()
        if signal_dir is not None:
            _write_atomically(signal_dir / STARTED, text)
        if text == RELEASE:
            assert signal_dir is not None, "a release needs SIGNAL_DIR"
            # The release comes from another process, as a file: poll for it.
            while not (signal_dir / RELEASE).exists():  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        else:
            await asyncio.sleep(float(text or "1"))
        return b"done"

    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Sleep": grpc.unary_unary_rpc_method_handler(sleep)}
    )
    return ServiceDefinition(
        name="slowtest",
        service_names=[SERVICE],
        register=lambda server: server.add_generic_rpc_handlers([handler]),
        # Declared like every served method (SEC-3); undeclared it would fail closed.
        authorization={f"/{SERVICE}/Sleep": deployment_read(*ANY_ROLE)},
    )


def main() -> int:
    """Serve until SIGTERM; write the bound port to ``argv[1]``."""
    port_file = Path(sys.argv[1])
    signal_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else None

    def ready(running: RunningServer) -> None:
        _write_atomically(port_file, str(running.port))

    return asyncio.run(serve(build(signal_dir), ServerSettings(), ready=ready))


if __name__ == "__main__":
    raise SystemExit(main())
