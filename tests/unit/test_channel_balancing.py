"""Outgoing channels choose round-robin for a ``dns:///`` target (SCALE-7).

The option is checked here; ``tests/integration/test_balanced_channels.py`` shows that it
really spreads calls over several real servers and skips a draining one.
"""

from __future__ import annotations

import json

import pytest

from grpcserver.channels import ROUND_ROBIN_SERVICE_CONFIG, channel_options

pytestmark = pytest.mark.spec("SCALE-7")


def _service_config(options: list[tuple[str, int | str]]) -> dict[str, object] | None:
    configs = [value for name, value in options if name == "grpc.service_config"]
    assert len(configs) <= 1
    return json.loads(str(configs[0])) if configs else None


@pytest.mark.parametrize(
    "address",
    [
        "dns:///host-headless:50051",
        "dns:///host-headless.tutti.svc.cluster.local:50051",
        "DNS:///host-headless:50051",
        "ipv4:127.0.0.1:50051,127.0.0.1:50052",
        "ipv6:[::1]:50051,[::1]:50052",
    ],
)
def test_a_dns_target_gets_round_robin_over_healthy_servers(address: str) -> None:
    """A resolver target that may name several servers balances calls and checks health."""
    options = channel_options(address, [("grpc.max_receive_message_length", 1024)])
    assert options[0] == ("grpc.max_receive_message_length", 1024)
    config = _service_config(options)
    assert config == {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ""},
    }
    # A TXT record in DNS cannot swap the policy for another one.
    assert ("grpc.service_config_disable_resolution", 1) in options


@pytest.mark.parametrize(
    "address", ["host:50051", "127.0.0.1:50051", "localhost:50051", "unix:/tmp/x.sock"]
)
def test_a_plain_address_keeps_the_default_policy(address: str) -> None:
    """``host:port`` (a ClusterIP Service, a local server) is unchanged: no service config."""
    assert channel_options(address) == []
    assert channel_options(address, [("grpc.primary_user_agent", "x")]) == [
        ("grpc.primary_user_agent", "x")
    ]


def test_a_callers_service_config_wins() -> None:
    """A caller that brings its own service config keeps it, unmerged."""
    own = json.dumps({"loadBalancingConfig": [{"pick_first": {}}]})
    options = channel_options("dns:///host-headless:50051", [("grpc.service_config", own)])
    assert options == [("grpc.service_config", own)]
    assert own != ROUND_ROBIN_SERVICE_CONFIG
