"""The production overlay runs host and livestream as several replicas (SCALE-7, ADR 0006).

Rendered with ``deploy/render.py`` like ``test_manifests.py`` (whose helpers these reuse):
rolling updates that never drop below the replica count, PodDisruptionBudgets that select the
pods, the drain wired to ``preStop``, headless Services behind every ``dns:///`` address the
suite dials with ``round_robin``, and NATS JetStream as a three-member StatefulSet.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes_validate.utils import validate
from pydantic import ValidationError

from deploy.render import split_image
from grpcserver.channels import channel_options
from livelog.settings import LiveLogSettings
from tests.deploy.test_manifests import (
    BUS_VARIABLES,
    KUBERNETES_VERSIONS,
    SERVICES,
    config_data,
    effective_env,
    of_kind,
    rendered,
)

pytestmark = pytest.mark.spec("SCALE-7")

Document = dict[str, Any]

REPLICATED = ("host", "livestream")
"""Rolled surge first with the drain behind preStop, on the bus."""
MULTI_REPLICA = ("host", "livestream")
"""Two or more replicas behind a PDB (host since SCALE-2, ADR 0042)."""
NATS_MEMBERS = 3
NATS_CLIENT_PORT = 4222
NATS_CLUSTER_PORT = 6222
# The live log needs JetStream features of 2.11 and later (research/scaleout.md §2.6).
NATS_MINIMUM = (2, 11)
DEFAULT_GRACE_SECONDS = 20.0


def production() -> list[Document]:
    """The rendered production overlay."""
    return rendered("production")


def pod_spec(docs: list[Document], kind: str, name: str) -> Document:
    """The pod spec of one workload."""
    spec: Document = of_kind(docs, kind)[name]["spec"]["template"]["spec"]
    return spec


def nats_conf(docs: list[Document]) -> str:
    """The nats-server configuration file the StatefulSet mounts."""
    text: str = of_kind(docs, "ConfigMap")["nats-config"]["data"]["nats.conf"]
    return text


def conf_value(conf: str, key: str) -> str:
    """The value of one ``key: value`` line of the NATS configuration (first occurrence)."""
    match = re.search(rf"^\s*{re.escape(key)}\s*[:=]\s*(\S+)\s*$", conf, re.MULTILINE)
    assert match, f"{key} is not set in nats.conf"
    return match.group(1)


def conf_block(conf: str, name: str) -> str:
    """The body of a top-level ``name { ... }`` block (blocks here hold no nested braces)."""
    match = re.search(rf"^\s*{name}\s*\{{(.*?)^\s*\}}", conf, re.MULTILINE | re.DOTALL)
    assert match, f"nats.conf has no {name} block"
    return match.group(1)


def seconds(value: str) -> float:
    """A NATS duration such as ``30s`` or ``2m`` in seconds."""
    match = re.fullmatch(r"(\d+)(s|m)", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


# --- the new documents ----------------------------------------------------------------------


SCALE_KINDS = {"StatefulSet", "PodDisruptionBudget", "NetworkPolicy", "Service", "ConfigMap"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_scale_out_documents_pass_the_strict_schema(version: str) -> None:
    """Every object the scale-out adds, and the patched Deployments, validate strictly."""
    docs = production()
    chosen = [
        doc
        for doc in docs
        if (doc["kind"] == "Deployment" and doc["metadata"]["name"] in REPLICATED)
        or (
            doc["kind"] in SCALE_KINDS and doc["metadata"]["name"].startswith(("nats", "tutti-bus"))
        )
        or doc["metadata"]["name"].endswith("-headless")
        or (doc["kind"] == "PodDisruptionBudget" and doc["metadata"]["name"] in MULTI_REPLICA)
    ]
    names = {(doc["kind"], doc["metadata"]["name"]) for doc in chosen}
    assert {("StatefulSet", "nats"), ("NetworkPolicy", "nats"), ("ConfigMap", "tutti-bus")} <= names
    assert {("PodDisruptionBudget", name) for name in (*MULTI_REPLICA, "nats")} <= names
    for doc in chosen:
        validate(doc, version, strict=True)


# --- host and livestream: replicas, rollout, disruption, drain --------------------------------


@pytest.mark.parametrize("service", REPLICATED)
def test_replicated_services_roll_without_losing_capacity(service: str) -> None:
    """Two or more replicas; a rollout surges first, waits minReady."""
    deployment = of_kind(production(), "Deployment")[service]["spec"]
    assert deployment["replicas"] >= (2 if service in MULTI_REPLICA else 1)
    assert deployment["strategy"]["type"] == "RollingUpdate"
    rolling = deployment["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0
    assert rolling["maxSurge"] >= 1
    assert deployment["minReadySeconds"] > 0


@pytest.mark.spec("SCALE-2")
def test_host_runs_two_replicas_behind_a_budget_now_any_replica_reaches_its_runtime() -> None:
    """A runtime may attach to either host replica (SCALE-2): two pods, one kept by a PDB."""
    docs = production()
    assert of_kind(docs, "Deployment")["host"]["spec"]["replicas"] >= 2
    budget = of_kind(docs, "PodDisruptionBudget")["host"]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"] == {"app.kubernetes.io/name": "host"}


@pytest.mark.parametrize("service", MULTI_REPLICA)
def test_replicated_services_have_budgets_that_select_their_pods(service: str) -> None:
    """A PDB keeps at least one pod through voluntary disruptions and selects exactly them."""
    docs = production()
    deployment = of_kind(docs, "Deployment")[service]["spec"]
    budget = of_kind(docs, "PodDisruptionBudget")[service]["spec"]
    labels = deployment["template"]["metadata"]["labels"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["selector"] == deployment["selector"]
    assert 1 <= budget["minAvailable"] < deployment["replicas"]
    # No other workload's pods fall under this budget.
    for other in of_kind(docs, "Deployment").values():
        if other["metadata"]["name"] != service:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not budget["selector"]["matchLabels"].items() <= other_labels.items()


@pytest.mark.parametrize("service", REPLICATED)
def test_drain_is_wired_to_pre_stop_within_the_grace(service: str) -> None:
    """preStop sleeps while the endpoint removal spreads; the grace covers sleep and drain."""
    docs = production()
    pod = pod_spec(docs, "Deployment", service)
    container = pod["containers"][0]
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep > 0
    env = effective_env(container, docs)
    drain = float(env.get("TUTTI_GRACE_PERIOD_SECONDS", DEFAULT_GRACE_SECONDS))
    delay = float(env["TUTTI_DRAIN_DELAY_SECONDS"])
    assert 0 < delay <= drain / 2
    # The kubelet counts the termination grace from the start of preStop.
    assert pod["terminationGracePeriodSeconds"] > sleep + drain


# --- client-side load balancing ---------------------------------------------------------------


def test_dialed_services_are_balanced_over_headless_services() -> None:
    """Every address the suite dials is ``dns:///`` on a headless Service, so round_robin."""
    docs = production()
    services = of_kind(docs, "Service")
    deployments = of_kind(docs, "Deployment")
    addresses = {k: v for k, v in config_data(docs).items() if k.endswith("_ADDRESS")}
    assert {"TUTTI_HOST_ADDRESS", "TUTTI_APPCENTER_ADDRESS", "TUTTI_ISSUEMANAGER_ADDRESS"} <= set(
        addresses
    )
    for variable, address in addresses.items():
        config = dict(channel_options(address)).get("grpc.service_config")
        assert config is not None, (variable, address)
        assert json.loads(str(config))["loadBalancingConfig"] == [{"round_robin": {}}]
        name, _, port = address.removeprefix("dns:///").partition(":")
        service = services[name]["spec"]
        assert service["clusterIP"] == "None", name
        assert not service.get("publishNotReadyAddresses", False), name
        (target,) = (
            deployment
            for deployment in deployments.values()
            if deployment["spec"]["selector"]["matchLabels"] == service["selector"]
        )
        assert target["spec"]["replicas"] >= 2, name
        assert {entry["port"] for entry in service["ports"]} == {int(port)}
        assert int(port) == SERVICES[target["metadata"]["name"]]


def test_every_replicated_grpc_service_has_a_headless_service() -> None:
    """Host and livestream (and the backends host's peers dial) expose their pods by name."""
    services = of_kind(production(), "Service")
    for name in (*REPLICATED, "appcenter", "issuemanager"):
        headless = services[f"{name}-headless"]["spec"]
        assert headless["clusterIP"] == "None"
        assert headless["selector"] == {"app.kubernetes.io/name": name}
        (port,) = headless["ports"]
        assert (port["name"], port["port"], port["appProtocol"]) == ("grpc", SERVICES[name], "grpc")


# --- the bus ------------------------------------------------------------------------------------


def test_host_and_livestream_use_the_nats_bus() -> None:
    """TUTTI_BUS=nats and TUTTI_NATS_URL (the nats client Service) for host and livestream only."""
    docs = production()
    services = of_kind(docs, "Service")
    for name, deployment in of_kind(docs, "Deployment").items():
        env = effective_env(deployment["spec"]["template"]["spec"]["containers"][0], docs)
        if name not in REPLICATED:
            assert not BUS_VARIABLES & set(env), name
            continue
        assert env["TUTTI_BUS"] == "nats", name
        match = re.fullmatch(r"nats://([a-z0-9-]+):(\d+)", env["TUTTI_NATS_URL"])
        assert match, env["TUTTI_NATS_URL"]
        client = services[match.group(1)]["spec"]
        assert client["selector"] == {"app.kubernetes.io/name": "nats"}
        assert int(match.group(2)) in {entry["port"] for entry in client["ports"]}
        assert int(match.group(2)) == NATS_CLIENT_PORT


@pytest.mark.parametrize("service", REPLICATED)
def test_bus_settings_are_valid_live_log_settings(service: str) -> None:
    """The overlay's TUTTI_BUS and TUTTI_NATS_URL are accepted by the live log's settings."""
    docs = production()
    env = effective_env(pod_spec(docs, "Deployment", service)["containers"][0], docs)
    try:
        settings = LiveLogSettings(bus=env["TUTTI_BUS"], nats_url=env["TUTTI_NATS_URL"])
    except ValidationError as error:
        pytest.fail(f"the overlay's bus settings are refused: {error}")
    assert settings.bus == "nats"


# --- NATS JetStream ---------------------------------------------------------------------------


def test_nats_runs_three_members_with_persistent_volumes() -> None:
    """A StatefulSet of three, each member with a claim mounted where JetStream stores."""
    docs = production()
    statefulset = of_kind(docs, "StatefulSet")["nats"]["spec"]
    assert statefulset["replicas"] == NATS_MEMBERS
    (claim,) = statefulset["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    (container,) = statefulset["template"]["spec"]["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    store_dir = conf_value(conf_block(nats_conf(docs), "jetstream"), "store_dir")
    assert mounts[claim["metadata"]["name"]] == store_dir
    volumes = {volume["name"] for volume in statefulset["template"]["spec"].get("volumes", [])}
    assert claim["metadata"]["name"] not in volumes  # the claim, not an ephemeral volume


def test_nats_config_enables_jetstream_and_routes_every_member() -> None:
    """JetStream on; the cluster block routes to each member by its stable headless name."""
    docs = production()
    conf = nats_conf(docs)
    statefulset = of_kind(docs, "StatefulSet")["nats"]["spec"]
    (container,) = statefulset["template"]["spec"]["containers"]
    assert container["args"] == ["--config", "/etc/nats/nats.conf"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["config"] == "/etc/nats"
    assert conf_block(conf, "jetstream")
    # Each member names itself after its pod: JetStream clustering needs unique, stable names.
    assert conf_value(conf, "server_name") == "$POD_NAME"
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    cluster = conf_block(conf, "cluster")
    assert conf_value(cluster, "name")
    routes = re.findall(r"nats://([a-z0-9.-]+):(\d+)", cluster)
    headless = statefulset["serviceName"]
    assert sorted(routes) == [
        (f"nats-{index}.{headless}", str(NATS_CLUSTER_PORT)) for index in range(NATS_MEMBERS)
    ]
    service = of_kind(docs, "Service")[headless]["spec"]
    assert service["clusterIP"] == "None"
    # Members must find each other before any of them is ready.
    assert service["publishNotReadyAddresses"] is True
    assert service["selector"] == statefulset["selector"]["matchLabels"]
    assert NATS_CLUSTER_PORT in {entry["port"] for entry in service["ports"]}


def test_nats_has_a_client_service_and_keeps_its_quorum() -> None:
    """A ClusterIP client Service; the PDB lets at most a minority go at once."""
    docs = production()
    statefulset = of_kind(docs, "StatefulSet")["nats"]["spec"]
    client = of_kind(docs, "Service")["nats"]["spec"]
    assert client.get("clusterIP") != "None"
    assert client["selector"] == statefulset["selector"]["matchLabels"]
    assert {entry["port"] for entry in client["ports"]} == {NATS_CLIENT_PORT}
    budget = of_kind(docs, "PodDisruptionBudget")["nats"]["spec"]
    assert budget["selector"] == statefulset["selector"]
    assert NATS_MEMBERS - budget["maxUnavailable"] > NATS_MEMBERS // 2


def test_nats_image_is_pinned_at_2_11_or_newer() -> None:
    """A registry image with an explicit version tag, 2.11 or later."""
    container = pod_spec(production(), "StatefulSet", "nats")["containers"][0]
    name, tag, digest = split_image(container["image"])
    assert name.endswith("/nats")
    assert tag is not None or digest is not None
    version = re.match(r"(\d+)\.(\d+)\.(\d+)", tag or "")
    assert version, f"{container['image']}: pin a full version (or a digest)"
    assert (int(version.group(1)), int(version.group(2))) >= NATS_MINIMUM


def test_nats_drains_in_lame_duck_mode_within_its_grace() -> None:
    """preStop starts lame-duck mode through the pid file; the grace outlasts it."""
    docs = production()
    pod = pod_spec(docs, "StatefulSet", "nats")
    conf = nats_conf(docs)
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    pid_file = conf_value(conf, "pid_file")
    assert command == ["nats-server", "--signal", f"ldm={pid_file}"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    pid_dir = pid_file.rsplit("/", 1)[0]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts[pid_dir]]
    lame_duck = seconds(conf_value(conf, "lame_duck_duration"))
    assert pod["terminationGracePeriodSeconds"] > lame_duck


def test_only_host_and_livestream_reach_the_nats_clients_port() -> None:
    """The NetworkPolicy admits clients from host and livestream and routes from members."""
    docs = production()
    policy = of_kind(docs, "NetworkPolicy")["nats"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nats"}
    assert policy["policyTypes"] == ["Ingress"]
    client_sources: list[Any] = []
    for rule in policy["ingress"]:
        ports = {entry["port"] for entry in rule["ports"]}
        if "client" in ports:
            assert "from" in rule, "the client port is open to every pod"
            client_sources.extend(rule["from"])
    allowed: set[str] = set()
    for source in client_sources:
        selector = source["podSelector"]
        allowed |= set(selector.get("matchLabels", {}).values())
        for expression in selector.get("matchExpressions", []):
            assert expression["key"] == "app.kubernetes.io/name"
            assert expression["operator"] == "In"
            allowed |= set(expression["values"])
    assert allowed == {*REPLICATED, "nats"}
