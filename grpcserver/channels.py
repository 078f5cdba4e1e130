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
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc

from grpcserver.settings import ServerSettings, StartupError

__all__ = ["aio_channel", "channel_credentials", "read_pem", "sync_channel"]


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

    ``options`` are gRPC channel arguments such as ``grpc.max_receive_message_length``.
    """
    credentials = channel_credentials(settings)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    return grpc.aio.secure_channel(address, credentials, options=list(options))


def sync_channel(address: str, settings: ServerSettings) -> grpc.Channel:
    """A blocking channel to ``address`` (the CLI)."""
    credentials = channel_credentials(settings)
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)
