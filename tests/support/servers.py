"""Live gRPC servers on 127.0.0.1 port 0 for integration and contract tests.

A server runs the real bootstrap (:func:`grpcserver.app.start_server`) on its own event
loop in a background thread, so tests talk to it through ordinary sync gRPC channels
over a real socket. Tokens are fixed test principals (see ``TEST_PRINCIPALS``).
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from grpcserver.app import RunningServer, start_server
from grpcserver.auth import TokenRegistry, token_digest

PRINCIPALS_FILE = Path(__file__).parent.parent / "contract" / "fixtures" / "principals.yaml"
TEST_PRINCIPALS: dict[str, dict[str, Any]] = yaml.safe_load(PRINCIPALS_FILE.read_text())[
    "principals"
]
"""Principal name -> role and workspaces (shared with the contract fixtures); the
bearer token of a principal is ``token-<name>``."""


def token_for(principal: str) -> str:
    """The bearer token of a test principal."""
    return f"token-{principal}"


def test_registry() -> TokenRegistry:
    """A registry holding every test principal."""
    return TokenRegistry.from_entries(
        [
            {"subject": name, "sha256": token_digest(token_for(name)), **spec}
            for name, spec in TEST_PRINCIPALS.items()
        ]
    )


def write_admin_token_file(path: Path, token: str) -> Path:
    """Write a token registry with one admin token (for tests starting real processes)."""
    entry = {"subject": "test-admin", "role": "admin", "workspaces": ["*"]}
    path.write_text(yaml.safe_dump({"tokens": [{**entry, "sha256": token_digest(token)}]}))
    return path


def write_test_token_file(path: Path) -> Path:
    """Write a token registry holding every test principal (for real server processes)."""
    entries = [
        {"subject": name, "sha256": token_digest(token_for(name)), **spec}
        for name, spec in TEST_PRINCIPALS.items()
    ]
    path.write_text(yaml.safe_dump({"tokens": entries}))
    return path


def auth_metadata(principal: str) -> tuple[tuple[str, str], ...]:
    """Call metadata authenticating as ``principal``."""
    return (("authorization", f"Bearer {token_for(principal)}"),)


@dataclass
class LiveServer:
    """A started service: its address and a channel to it."""

    name: str
    address: str
    channel: grpc.Channel
    running: RunningServer
    _stop: Callable[[float], None] = field(repr=False)

    def stop(self, grace: float = 0.0) -> None:
        """Drain and stop the server."""
        self._stop(grace)


class _ServerThread(threading.Thread):
    def __init__(self, name: str, settings: Any, build: Callable[[Any], Any] | None) -> None:
        super().__init__(name=f"server-{name}", daemon=True)
        self._name = name
        self._settings = settings
        self._build = build
        self.started: Future[RunningServer] = Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._finished = threading.Event()

    def run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()
            self._finished.set()

    async def _main(self) -> None:
        self._stop_event = asyncio.Event()
        module = importlib.import_module(f"services.{self._name}.app")
        build = self._build or module.build
        try:
            running = await start_server(
                build(self._settings), self._settings, tokens=test_registry()
            )
        except BaseException as error:  # noqa: BLE001 - surfaced to the test
            self.started.set_exception(error)
            return
        self.started.set_result(running)
        await self._stop_event.wait()
        await running.stop(self._grace)

    def stop(self, grace: float) -> None:
        if self._loop is None or self._finished.is_set():
            return
        self._grace = grace
        self._loop.call_soon_threadsafe(self._stop_event.set)
        self._finished.wait(timeout=30)


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start services by name: ``live_server("host", database_url=...)``; ``build`` replaces
    the service's ``build(settings)`` (for example to give livestream a scripted source)."""
    started: list[tuple[_ServerThread, grpc.Channel]] = []

    def start(name: str, build: Callable[[Any], Any] | None = None, **overrides: Any) -> LiveServer:
        module = importlib.import_module(f"services.{name}.app")
        settings = module.Settings(
            listen_address="127.0.0.1:0",
            data_dir=tmp_path / f"data-{name}",
            log_format="text",
            **overrides,
        )
        thread = _ServerThread(name, settings, build)
        thread.start()
        running = thread.started.result(timeout=30)
        address = f"127.0.0.1:{running.port}"
        channel = grpc.insecure_channel(address)
        started.append((thread, channel))
        return LiveServer(name, address, channel, running, thread.stop)

    yield start
    for thread, channel in reversed(started):
        channel.close()
        thread.stop(0.0)
