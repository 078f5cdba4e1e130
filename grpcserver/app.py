"""Server lifecycle shared by every service: start, readiness, SIGTERM drain (ARCH-4).

A service describes itself with a :class:`ServiceDefinition`; :func:`start_server`
builds a ``grpc.aio`` server with the interceptor, health and reflection, binds the
port, runs the service's start hooks and only then reports SERVING. :func:`serve`
adds signal handling: on SIGTERM or SIGINT health turns NOT_SERVING, new RPCs are
refused, the service's drain hooks end its long-lived streams (they answer ``UNAVAILABLE``
``DRAINING`` so clients resume elsewhere), in-flight RPCs get the rest of
``grace_period_seconds`` to finish, stop hooks run, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry.metrics import Meter

from grpcserver.auth import TokenRegistry
from grpcserver.authorization import MethodPolicy, ServiceAuthorization, policies_by_path
from grpcserver.channels import read_pem
from grpcserver.interceptor import ServiceInterceptor
from grpcserver.logs import configure_logging
from grpcserver.settings import ServerSettings, StartupError
from grpcserver.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]

ServerOption = tuple[str, int | str]

BASE_SERVER_OPTIONS: tuple[ServerOption, ...] = (
    # SEC-5: the port is this server's alone. gRPC binds with SO_REUSEPORT by default, so a
    # second server on an occupied port would start and share it; without it the bind fails.
    ("grpc.so_reuseport", 0),
    # Mobile links sit behind NATs: accept client pings every 10 s without data.
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
)
"""Options of every server; a service adds its own (:attr:`ServiceDefinition.server_options`)."""


@dataclass
class ServiceDefinition:
    """What one service contributes to the shared server.

    Attributes:
        name: Short service name (``host``, ``refresolve`` ...), used in logs and
            as the ``ErrorInfo`` domain prefix.
        service_names: Full proto names of the services it serves, for health and
            reflection (``agentactivity.host.v1.HostService``).
        register: Adds the servicers to the server.
        authorization: The declared authorization of every served method, by full
            method path (``/pkg.Service/Method``, SEC-3); the interceptor refuses a
            method missing here with ``PERMISSION_DENIED`` ``METHOD_NOT_DECLARED``.
        on_start: Run after the port is bound and before SERVING (open the store,
            start background workers). A failure aborts the start.
        on_drain: Run once new RPCs are refused, before the grace period is waited
            out: end long-lived streams (watches, links) so they do not hold the drain
            for the whole grace. In-flight unary RPCs are left to finish.
        on_stop: Run after the server stopped (close pools, flush).
        server_options: gRPC server options of this service, added to (or overriding)
            :data:`BASE_SERVER_OPTIONS`, e.g. a larger ``grpc.max_receive_message_length``.
        instruments: Called once with the service's OpenTelemetry meter before the start
            hooks, to register the service's own metrics (exported with the RPC metrics).
    """

    name: str
    service_names: Sequence[str]
    register: Callable[[grpc.aio.Server], None]
    authorization: Mapping[str, MethodPolicy] = field(default_factory=dict)
    on_start: list[Hook] = field(default_factory=list)
    on_drain: list[Hook] = field(default_factory=list)
    on_stop: list[Hook] = field(default_factory=list)
    server_options: Sequence[ServerOption] = ()
    instruments: list[Callable[[Meter], None]] = field(default_factory=list)


def definition_for(
    name: str,
    servicers: Sequence[tuple[Any, Callable[[Any, grpc.aio.Server], None], object]],
    *,
    authorization: Iterable[ServiceAuthorization] = (),
    on_start: Sequence[Hook] = (),
    on_drain: Sequence[Hook] = (),
    on_stop: Sequence[Hook] = (),
    server_options: Sequence[ServerOption] = (),
    instruments: Sequence[Callable[[Meter], None]] = (),
) -> ServiceDefinition:
    """Build a definition from ``(service descriptor, add_*_to_server, servicer)`` triples.

    ``authorization`` is the service's table (``services/<name>/authorization.py``).
    """

    def register(server: grpc.aio.Server) -> None:
        for _, add, servicer in servicers:
            add(servicer, server)

    return ServiceDefinition(
        name=name,
        service_names=[descriptor.full_name for descriptor, _, _ in servicers],
        register=register,
        authorization=policies_by_path(authorization),
        on_start=list(on_start),
        on_drain=list(on_drain),
        on_stop=list(on_stop),
        server_options=tuple(server_options),
        instruments=list(instruments),
    )


@dataclass
class RunningServer:
    """A started server; ``port`` is the bound port (useful with port 0)."""

    definition: ServiceDefinition
    server: grpc.aio.Server
    health: HealthServicer
    port: int
    telemetry: Telemetry
    grace_period_seconds: float
    drain_delay_seconds: float = 0.0
    _stopped: bool = False

    async def stop(self, grace: float | None = None) -> None:
        """Drain within ``grace`` seconds (default: the configured grace period).

        Health turns NOT_SERVING at once; the server keeps answering for the drain
        delay so load balancers notice, then refuses new RPCs, runs the drain hooks
        (long-lived streams end with ``UNAVAILABLE`` ``DRAINING``) and gives in-flight
        RPCs the rest of the grace period before cancelling them.
        """
        if self._stopped:
            return
        self._stopped = True
        budget = self.grace_period_seconds if grace is None else grace
        await self.health.enter_graceful_shutdown()
        delay = min(self.drain_delay_seconds, budget / 2) if grace is None else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        # Refuse new RPCs first, so a stream ended by a drain hook cannot reconnect here.
        stopping = asyncio.ensure_future(self.server.stop(max(0.0, budget - delay)))
        await asyncio.sleep(0)
        for hook in self.definition.on_drain:
            try:
                await hook()
            except Exception:
                log.exception("drain hook failed")
        await stopping
        for hook in reversed(self.definition.on_stop):
            try:
                await hook()
            except Exception:
                log.exception("stop hook failed")
        self.telemetry.shutdown()


def load_tokens(settings: ServerSettings) -> TokenRegistry:
    """Load the configured token registry, or an empty (deny-all) one."""
    path = settings.resolved_tokens_file()
    if path is None:
        log.warning("no auth token registry configured: every RPC will be UNAUTHENTICATED")
        return TokenRegistry.empty()
    return TokenRegistry.from_file(path)


def _credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    client_ca = (
        read_pem(settings.tls_client_ca_file, "TUTTI_TLS_CLIENT_CA_FILE")
        if settings.tls_client_ca_file
        else None
    )
    return grpc.ssl_server_credentials(
        [
            (
                read_pem(settings.tls_key_file, "TUTTI_TLS_KEY_FILE"),
                read_pem(settings.tls_cert_file, "TUTTI_TLS_CERT_FILE"),
            )
        ],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def server_options(definition: ServiceDefinition) -> list[ServerOption]:
    """The gRPC options of ``definition``'s server: the base ones, the service's win."""
    options = dict(BASE_SERVER_OPTIONS)
    options.update(definition.server_options)
    return list(options.items())


def _split_address(address: str) -> tuple[str, int] | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _port_in_use(address: str) -> bool:
    """Whether another socket holds ``address``.

    Checked the way gRPC binds (SO_REUSEADDR, no SO_REUSEPORT), so a busy port fails with our
    message before gRPC logs its own.
    """
    parts = _split_address(address)
    if parts is None or parts[1] == 0:
        return False
    host, port = parts
    try:
        candidates = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return False  # gRPC reports an unresolvable address itself
    for family, kind, proto, _, sockaddr in candidates:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return True
    return False


def _bind(server: grpc.aio.Server, settings: ServerSettings) -> int:
    """Bind the listening port (SEC-5).

    Raises:
        StartupError: the port is in use or the address cannot be bound (one line, naming
            the address).
    """
    address = settings.listen_address
    if _port_in_use(address):
        raise StartupError(f"cannot listen on {address}: the port is already in use")
    credentials = _credentials(settings)
    try:
        if credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, credentials)
    except RuntimeError:
        reason = "the port is already in use" if _port_in_use(address) else "bind failed"
        raise StartupError(f"cannot listen on {address}: {reason}") from None


async def start_server(
    definition: ServiceDefinition,
    settings: ServerSettings,
    *,
    tokens: TokenRegistry | None = None,
) -> RunningServer:
    """Build, bind and start a server; report SERVING once the start hooks succeed."""
    telemetry = setup_telemetry(definition.name, settings)
    meter = telemetry.meter_provider.get_meter(f"tutti.{definition.name}")
    for register_instruments in definition.instruments:
        register_instruments(meter)
    interceptor = ServiceInterceptor(
        domain=f"{definition.name}.agentactivity",
        tokens=tokens if tokens is not None else load_tokens(settings),
        telemetry=telemetry,
        authorization=definition.authorization,
    )
    server = grpc.aio.server(
        interceptors=[*telemetry.server_interceptors, interceptor],
        options=server_options(definition),
    )
    health = HealthServicer()
    for name in ("", *definition.service_names):
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    definition.register(server)
    if settings.reflection:
        reflection.enable_server_reflection(
            (
                *definition.service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
    try:
        port = _bind(server, settings)
    except StartupError:
        await server.stop(0)
        telemetry.shutdown()
        raise
    await server.start()
    running = RunningServer(
        definition=definition,
        server=server,
        health=health,
        port=port,
        telemetry=telemetry,
        grace_period_seconds=settings.grace_period_seconds,
        drain_delay_seconds=settings.drain_delay_seconds,
    )
    try:
        for hook in definition.on_start:
            await hook()
    except BaseException:
        await running.stop(grace=0)
        raise
    for name in ("", *definition.service_names):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return running


async def serve(
    definition: ServiceDefinition,
    settings: ServerSettings,
    *,
    ready: Callable[[RunningServer], None] | None = None,
) -> int:
    """Run a service until SIGTERM/SIGINT, then drain and return the exit code 0.

    A :class:`~grpcserver.settings.StartupError` (port in use, unreadable TLS file, a
    dependency a start hook could not reach in its bound) is logged as one ERROR line without
    a traceback and returns exit code 1. SIGTERM/SIGINT while the start hooks run ends the
    start (hooks cancelled, port closed) and returns 0.
    """
    configure_logging(definition.name, level=settings.log_level, fmt=settings.log_format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # A start hook may wait on a dependency (the live log's first connection); a stop signal
    # meanwhile ends the start at once, as a drain of a server that never served (exit 0).
    starting = asyncio.create_task(start_server(definition, settings))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        log.info("stopped during start")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, StartupError):
            await starting
        return 0
    try:
        running = starting.result()
    except StartupError as error:
        log.error("%s failed to start: %s", definition.name, error)
        return 1
    log.info(
        "serving",
        extra={"port": running.port, "services": list(definition.service_names)},
    )
    if ready is not None:
        ready(running)
    await stop.wait()
    log.info("draining", extra={"grace_period_seconds": settings.grace_period_seconds})
    with contextlib.suppress(asyncio.CancelledError):
        await running.stop()
    log.info("stopped")
    return 0
