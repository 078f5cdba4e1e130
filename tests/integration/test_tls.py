"""TLS and mTLS by configuration, for servers and outgoing channels (SEC-1).

Certificates are made in the test with ``trustme``: one CA signs the servers' certificate
(for ``127.0.0.1``) and the clients' certificate. Servers are the real bootstrap on real
sockets; clients are built by :mod:`grpcserver.channels`, the one function every outgoing
channel of the suite uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme
from google.protobuf import json_format
from grpc_health.v1 import health_pb2
from typer.testing import CliRunner

from agentactivity.appcenter.v1 import appcenter_pb2, appcenter_pb2_grpc
from agentactivity.livestream.v1 import livestream_pb2, livestream_pb2_grpc
from agentactivity.refresolve.v1 import refresolve_pb2, refresolve_pb2_grpc
from grpcserver.app import ServiceDefinition, start_server
from grpcserver.auth import TokenRegistry
from grpcserver.channels import channel_credentials, sync_channel
from grpcserver.probes import check_health
from grpcserver.settings import ServerSettings, StartupError
from tests.support.references import artifact, start_refresolve
from tests.support.servers import LiveServer, auth_metadata, token_for
from tutti.cli import app as cli

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(frozen=True)
class Pki:
    """PEM files of one test CA, a server certificate and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    def server(self, *, mtls: bool = False) -> dict[str, Path]:
        """Server settings overrides: TLS, and with ``mtls`` client certificates required."""
        settings = {"tls_cert_file": self.server_cert, "tls_key_file": self.server_key}
        if mtls:
            settings["tls_client_ca_file"] = self.ca
        return settings

    def client(self, *, certificate: bool = False) -> ServerSettings:
        """Client settings: trust the CA, and with ``certificate`` present the client cert."""
        if certificate:
            return ServerSettings(
                tls_ca_file=self.ca,
                tls_client_cert_file=self.client_cert,
                tls_client_key_file=self.client_key,
            )
        return ServerSettings(tls_ca_file=self.ca)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh CA with a server certificate for 127.0.0.1 and a client certificate."""
    directory = tmp_path / "pki"
    directory.mkdir()
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("refresolve.test")
    files = Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.private_key_pem.write_to_path(str(files.client_key))
    for certificate, path in ((server, files.server_cert), (client, files.client_cert)):
        for index, blob in enumerate(certificate.cert_chain_pems):
            blob.write_to_path(str(path), append=index > 0)
    trustme.CA().cert_pem.write_to_path(str(files.other_ca))
    return files


def _health(channel: grpc.Channel) -> object:
    return check_health(channel, timeout=10)


def _refused(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as failure:
        check_health(channel, timeout=10)
    code: grpc.StatusCode = failure.value.code()
    return code


@pytest.mark.spec("SEC-1")
def test_a_tls_server_accepts_a_tls_client_and_refuses_plaintext_and_strangers(
    pki: Pki, live_server: Callable[..., LiveServer]
) -> None:
    server = live_server("livestream", **pki.server())
    with sync_channel(server.address, pki.client()) as channel:
        assert _health(channel) == SERVING
        # Authenticated RPCs pass through the TLS channel; the token is still required.
        stub = livestream_pb2_grpc.DeviceLinkServiceStub(channel)
        request = livestream_pb2.ListPublishersRequest()
        with pytest.raises(grpc.RpcError) as anonymous:
            stub.ListPublishers(request, timeout=10)
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # With the token the call reaches the handler and is answered over TLS.
        listed = stub.ListPublishers(request, metadata=auth_metadata("admin"), timeout=10)
        assert list(listed.publishers) == []
    # Plaintext, and TLS that trusts another CA, never get through.
    with grpc.insecure_channel(server.address) as plaintext:
        assert _refused(plaintext) == grpc.StatusCode.UNAVAILABLE
    with sync_channel(server.address, ServerSettings(tls_ca_file=pki.other_ca)) as stranger:
        assert _refused(stranger) == grpc.StatusCode.UNAVAILABLE
    # Without TUTTI_TLS_CA_FILE a channel is plaintext.
    assert channel_credentials(ServerSettings()) is None


@pytest.mark.spec("SEC-1")
def test_an_mtls_server_refuses_a_client_without_a_certificate(
    pki: Pki, live_server: Callable[..., LiveServer]
) -> None:
    server = live_server("livestream", **pki.server(mtls=True))
    with sync_channel(server.address, pki.client()) as anonymous:
        assert _refused(anonymous) == grpc.StatusCode.UNAVAILABLE
    with sync_channel(server.address, pki.client(certificate=True)) as channel:
        assert _health(channel) == SERVING


APP = {
    "appId": "app-1",
    "displayName": "Reports",
    "artifacts": [artifact("/r/root.md")],
    "groups": [{"groupId": "g", "artifacts": [artifact("/r/g.md")]}],
}


def _load_app(channel: grpc.Channel) -> None:
    request = json_format.ParseDict(
        {"workspaceId": "ws-1", "apps": [APP]}, appcenter_pb2.LoadAppsRequest()
    )
    appcenter_pb2_grpc.AppCenterServiceStub(channel).LoadApps(
        request, metadata=auth_metadata("admin"), timeout=30
    )


def _list(server: LiveServer) -> refresolve_pb2.ListReferencesResponse:
    stub = refresolve_pb2_grpc.ReferenceServiceStub(server.channel)
    request = refresolve_pb2.ListReferencesRequest(
        workspace_id="ws-1", source=refresolve_pb2.REFERENCE_SOURCE_APP, id="app-1"
    )
    response: refresolve_pb2.ListReferencesResponse = stub.ListReferences(
        request, metadata=auth_metadata("ws1-device"), timeout=30
    )
    return response


@pytest.mark.spec("SEC-1", "REF-APP-1")
def test_refresolve_reaches_mtls_backends_with_the_configured_ca_and_certificate(
    pki: Pki, live_server: Callable[..., LiveServer], migrated_db_url: str
) -> None:
    appcenter = live_server("appcenter", database_url=migrated_db_url, **pki.server(mtls=True))
    issuemanager = live_server(
        "issuemanager", database_url=migrated_db_url, **pki.server(mtls=True)
    )
    with sync_channel(appcenter.address, pki.client(certificate=True)) as channel:
        _load_app(channel)
    refresolve = start_refresolve(
        live_server,
        appcenter.address,
        issuemanager.address,
        tls_ca_file=pki.ca,
        tls_client_cert_file=pki.client_cert,
        tls_client_key_file=pki.client_key,
    )
    assert [item.path for item in _list(refresolve).items] == ["/r/root.md", "/r/g.md"]
    # The same refresolve without its client certificate is refused by the backend: a
    # typed UNAVAILABLE, never a silent plaintext fallback.
    anonymous = start_refresolve(
        live_server, appcenter.address, issuemanager.address, tls_ca_file=pki.ca
    )
    with pytest.raises(grpc.RpcError) as failure:
        _list(anonymous)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.spec("SEC-1", "REF-CLI-1")
def test_the_cli_calls_a_tls_server_with_the_configured_ca(
    pki: Pki, live_server: Callable[..., LiveServer], migrated_db_url: str, tmp_path: Path
) -> None:
    appcenter = live_server("appcenter", database_url=migrated_db_url, **pki.server())
    issuemanager = live_server("issuemanager", database_url=migrated_db_url, **pki.server())
    with sync_channel(appcenter.address, pki.client()) as channel:
        _load_app(channel)
    refresolve = start_refresolve(
        live_server, appcenter.address, issuemanager.address, tls_ca_file=pki.ca, **pki.server()
    )
    arguments = ["reference", "list", "--source", "app", "--id", "app-1", "--workspace", "ws-1"]
    arguments += ["--token", token_for("ws1-device"), "--address", refresolve.address]
    env = {"TUTTI_DATA_DIR": str(tmp_path / "cli"), "TUTTI_TLS_CA_FILE": str(pki.ca)}
    listed = CliRunner().invoke(cli, arguments, env=env)
    assert listed.exit_code == 0, listed.output
    assert "/r/g.md" in listed.output
    plaintext = CliRunner().invoke(cli, arguments, env={**env, "TUTTI_TLS_CA_FILE": None})
    assert plaintext.exit_code != 0


@pytest.mark.spec("SEC-1", "OPS-1")
def test_half_a_tls_configuration_is_refused_at_start(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TUTTI_TLS_CERT_FILE and TUTTI_TLS_KEY_FILE"):
        ServerSettings(tls_cert_file=pki.server_cert)
    with pytest.raises(ValueError, match="TUTTI_TLS_CLIENT_CA_FILE needs TUTTI_TLS_CERT_FILE"):
        ServerSettings(tls_client_ca_file=pki.ca)
    with pytest.raises(ValueError, match="TUTTI_TLS_CLIENT_CERT_FILE needs TUTTI_TLS_CA_FILE"):
        ServerSettings(tls_client_cert_file=pki.client_cert, tls_client_key_file=pki.client_key)
    missing = tmp_path / "missing.pem"
    with pytest.raises(StartupError, match=f"TUTTI_TLS_CA_FILE: cannot read {missing}"):
        channel_credentials(ServerSettings(tls_ca_file=missing))


@pytest.mark.spec("SEC-1")
def test_an_unreadable_server_certificate_is_a_start_up_error(pki: Pki, tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    settings = ServerSettings(
        listen_address="127.0.0.1:0", tls_cert_file=missing, tls_key_file=pki.server_key
    )
    definition = ServiceDefinition(name="probe", service_names=[], register=lambda server: None)
    with pytest.raises(StartupError, match=f"TUTTI_TLS_CERT_FILE: cannot read {missing}"):
        asyncio.run(start_server(definition, settings, tokens=TokenRegistry.empty()))
