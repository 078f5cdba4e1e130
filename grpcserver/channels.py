"""How one process reaches another: channels built from settings (SEC-1 TLS and mTLS).

Every outgoing channel of the suite (refresolve to its backends, the demo runtime to Host,
the CLI to a server) is opened here, so TLS is configured once for all of them:

- without ``TUTTI_TLS_CA_FILE`` a channel is plaintext;
- with it, the channel speaks TLS and verifies the server's certificate against that CA
  bundle (the certificate must name the host of the address, an IP address included);
- with ``TUTTI_TLS_CLIENT_CERT_FILE`` and ``TUTTI_TLS_CLIENT_KEY_FILE`` as well, the
  channel presents that client certificate, for servers that require one (mTLS,
  ``TUTTI_TLS_CLIENT_CA_FILE`` on the server).

The PEM files are read when the channel is built; an unreadable one is a
:class:`~grpcserver.settings.StartupError` naming the setting.

Load balancing (SCALE-7): gRPC keeps one HTTP/2 connection per channel, so a ClusterIP Service
balances connections, not calls. An address with an explicit resolver scheme that can yield
several servers (``dns:///host-headless:50051`` for a headless Service, or an
``ipv4:``/``ipv6:`` list) gets a service config choosing ``round_robin`` with client-side
health checking: the channel connects to every address and spreads calls over the ones whose
``grpc.health.v1`` status is SERVING, so a replica that starts draining (NOT_SERVING, ADR 0005)
stops receiving new calls before it refuses them. A bare ``host:port`` keeps gRPC's default
(``pick_first``), as before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import grpc

from grpcserver.settings import ServerSettings, StartupError

__all__ = [
    "BALANCED_SCHEMES",
    "ROUND_ROBIN_SERVICE_CONFIG",
    "aio_channel",
    "channel_credentials",
    "channel_options",
    "read_pem",
    "sync_channel",
]

BALANCED_SCHEMES = ("dns:", "ipv4:", "ipv6:")
"""Target prefixes whose resolver may return several servers: calls are spread over them."""

ROUND_ROBIN_SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        # The overall server status (service ""), the one a drain turns NOT_SERVING.
        "healthCheckConfig": {"serviceName": ""},
    }
)
"""Service config of a balanced channel: ``round_robin`` over the healthy addresses."""

ChannelOption = tuple[str, int | str]


def channel_options(address: str, options: Sequence[ChannelOption] = ()) -> list[ChannelOption]:
    """The channel arguments for ``address``: ``options`` plus the load-balancing choice.

    Args:
        address: The gRPC target, e.g. ``host:50051`` or ``dns:///host-headless:50051``.
        options: Channel arguments the caller needs; a ``grpc.service_config`` among them
            wins over the one chosen here.

    Returns:
        ``options``, followed for a target in :data:`BALANCED_SCHEMES` by the round-robin
        service config and ``grpc.service_config_disable_resolution`` (a DNS TXT record must
        not replace it).
    """
    chosen = list(options)
    balanced = address.lower().startswith(BALANCED_SCHEMES)
    if balanced and all(name != "grpc.service_config" for name, _ in chosen):
        chosen.append(("grpc.service_config", ROUND_ROBIN_SERVICE_CONFIG))
        chosen.append(("grpc.service_config_disable_resolution", 1))
    return chosen


def read_pem(path: Path, setting: str) -> bytes:
    """Read a PEM file named by ``setting`` (``TUTTI_TLS_CA_FILE``...).

    Raises:
        StartupError: the file cannot be read.
    """
    try:
        return path.read_bytes()
    except OSError as error:
        raise StartupError(f"{setting}: cannot read {path}: {error.strerror}") from None


def channel_credentials(settings: ServerSettings) -> grpc.ChannelCredentials | None:
    """The TLS credentials outgoing channels use, or ``None`` for plaintext."""
    if settings.tls_ca_file is None:
        return None
    certificate_chain = private_key = None
    if settings.tls_client_cert_file is not None and settings.tls_client_key_file is not None:
        certificate_chain = read_pem(settings.tls_client_cert_file, "TUTTI_TLS_CLIENT_CERT_FILE")
        private_key = read_pem(settings.tls_client_key_file, "TUTTI_TLS_CLIENT_KEY_FILE")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(settings.tls_ca_file, "TUTTI_TLS_CA_FILE"),
        private_key=private_key,
        certificate_chain=certificate_chain,
    )


def aio_channel(
    address: str,
    settings: ServerSettings,
    options: Sequence[tuple[str, int | str]] = (),
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address`` (call inside the event loop that uses it).

    ``options`` are gRPC channel arguments such as ``grpc.max_receive_message_length``;
    :func:`channel_options` adds round-robin balancing for a ``dns:///`` target.
    """
    credentials = channel_credentials(settings)
    arguments = channel_options(address, options)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=arguments)
    return grpc.aio.secure_channel(address, credentials, options=arguments)


def sync_channel(address: str, settings: ServerSettings) -> grpc.Channel:
    """A blocking channel to ``address`` (the CLI), balanced like :func:`aio_channel`."""
    credentials = channel_credentials(settings)
    arguments = channel_options(address)
    if credentials is None:
        return grpc.insecure_channel(address, options=arguments)
    return grpc.secure_channel(address, credentials, options=arguments)
