"""The kustomize base and overlays render, pass the Kubernetes schemas and follow our rules.

Every kustomization is rendered with ``deploy/render.py``'s Python engine, which needs no
kubectl, so these tests run on a fresh machine. Where kubectl exists, a parity test requires
``kubectl kustomize`` to produce exactly the same objects.
"""

from __future__ import annotations

import copy
import functools
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import ValidationError, validate

from deploy.render import (
    RenderError,
    find_kubectl,
    render_kubectl,
    render_python,
    resource_id,
    split_image,
    strategic_merge,
)
from grpcserver.auth import Role, TokenRegistry
from grpcserver.settings import DEFAULT_PORTS, ServerSettings

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kustomize"
KUSTOMIZATIONS = {
    "base": KUSTOMIZE / "base",
    "local": KUSTOMIZE / "overlays" / "local",
    "production": KUSTOMIZE / "overlays" / "production",
}
OVERLAYS = ("local", "production")
SECRETS_TEMPLATE = KUSTOMIZE / "base" / "secrets.template.yaml"

# The oldest Kubernetes minor we support (PDB unhealthyPodEvictionPolicy is GA there; native
# gRPC probes since 1.27) and a newer one, so a removed or changed field shows up.
KUBERNETES_VERSIONS = ("1.31", "1.33")

# Service -> default gRPC port (the suite's settings defaults).
SERVICES = {
    "host": 50051,
    "refresolve": 50052,
    "livestream": 50053,
    "maintenance": 50054,
    "appcenter": 50055,
    "issuemanager": 50056,
}
METRICS_PORT = 9464
DEFAULT_GRACE_SECONDS = 20
APP_UID = 10001
# Single-replica services with the Recreate strategy, per kustomization. In production host
# runs several replicas (ADR 0006, SCALE-7; tests/deploy/test_replicas.py) and maintenance a
# worker and a standby (ADR 0035).
SINGLETONS: dict[str, tuple[str, ...]] = {
    "base": ("host", "maintenance"),
    "local": ("host", "maintenance"),
    "production": (),
}
# Settings of the cross-replica live log (SCALE-3), read by host and livestream only; checked
# by tests/deploy/test_replicas.py, which knows whether they are fields yet.
BUS_VARIABLES = frozenset({"TUTTI_BUS", "TUTTI_NATS_URL"})
NAMESPACE = "tutti"

Document = dict[str, Any]

pytestmark = pytest.mark.spec("DEPLOY-1")


@functools.cache
def _rendered(name: str) -> tuple[Document, ...]:
    return tuple(render_python(KUSTOMIZATIONS[name]))


def rendered(name: str) -> list[Document]:
    """The rendered documents of one kustomization (a private copy per call)."""
    return copy.deepcopy(list(_rendered(name)))


def of_kind(docs: list[Document], kind: str) -> dict[str, Document]:
    """Documents of one kind, by name."""
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def pod_templates(docs: list[Document]) -> Iterator[tuple[str, Document]]:
    """Every pod spec of a workload, with a label saying whose it is."""
    for doc in docs:
        if doc["kind"] in {"Deployment", "StatefulSet", "Job"}:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]


def containers(pod_template: Document) -> list[Document]:
    """All containers and init containers of a pod template."""
    spec = pod_template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def config_data(docs: list[Document]) -> dict[str, str]:
    """The data of the suite's ConfigMap."""
    data: dict[str, str] = of_kind(docs, "ConfigMap")["tutti-config"]["data"]
    return data


def effective_env(container: Document, docs: list[Document]) -> dict[str, Any]:
    """Environment as the kubelet builds it: envFrom ConfigMaps first, explicit env wins."""
    env: dict[str, Any] = {}
    configmaps = of_kind(docs, "ConfigMap")
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value", variable.get("valueFrom"))
    return env


def load_secret_template() -> dict[str, Document]:
    """The Secrets of ``secrets.template.yaml``, by name."""
    docs = list(yaml.safe_load_all(SECRETS_TEMPLATE.read_text(encoding="utf-8")))
    return {doc["metadata"]["name"]: doc for doc in docs}


# --- rendering and schema validation ---------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_passes_strict_kubernetes_schema(name: str, version: str) -> None:
    """Each rendered object validates against the Kubernetes JSON schema (unknown fields fail)."""
    docs = rendered(name)
    assert docs
    failures = []
    for doc in docs:
        try:
            validate(doc, version, strict=True)
        except ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            failures.append(f"{resource_id(doc)}: {path}: {error.message}")
    assert not failures, "\n".join(failures)


def test_secret_template_passes_strict_kubernetes_schema() -> None:
    """The Secret template an operator copies is itself valid."""
    for doc in load_secret_template().values():
        validate(doc, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_python_renderer_matches_kubectl_kustomize(name: str) -> None:
    """deploy/render.py and ``kubectl kustomize`` produce the same objects."""
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl is not on PATH; the Python renderer is used alone")
    ours = {resource_id(doc): doc for doc in rendered(name)}
    theirs = {resource_id(doc): doc for doc in render_kubectl(KUSTOMIZATIONS[name], kubectl)}
    assert sorted(ours) == sorted(theirs)
    for ident, doc in ours.items():
        assert doc == theirs[ident], ident


def test_resource_files_are_all_listed() -> None:
    """No manifest sits in a kustomization directory without being rendered or being a template."""
    for directory in KUSTOMIZATIONS.values():
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text("utf-8"))
        used = {str(entry) for entry in kustomization.get("resources", [])}
        used |= {str(entry["path"]) for entry in kustomization.get("patches", [])}
        for manifest in directory.glob("*.yaml"):
            if manifest.name == "kustomization.yaml" or manifest.name.endswith(".template.yaml"):
                continue
            assert manifest.name in used, f"{manifest} is not referenced by its kustomization"


# --- one Deployment, Service and ServiceAccount per service -----------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_each_service_has_deployment_service_and_serviceaccount(name: str) -> None:
    """Exactly the six services are deployed, each with its own identity (ARCH-1)."""
    docs = rendered(name)
    deployments = of_kind(docs, "Deployment")
    services = of_kind(docs, "Service")
    accounts = of_kind(docs, "ServiceAccount")
    assert set(deployments) == set(SERVICES)
    for service in SERVICES:
        assert service in services
        assert accounts[service]["automountServiceAccountToken"] is False
        pod = deployments[service]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == service
        assert pod["automountServiceAccountToken"] is False
        assert pod["containers"][0]["args"] == ["serve", service]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_services_route_grpc_and_metrics_to_the_pods(name: str) -> None:
    """Service ports: ``grpc`` (appProtocol grpc) on the service's port and ``metrics``."""
    docs = rendered(name)
    deployments = of_kind(docs, "Deployment")
    for service_name, port in SERVICES.items():
        service = of_kind(docs, "Service")[service_name]
        template = deployments[service_name]["spec"]["template"]
        selector = service["spec"]["selector"]
        assert selector.items() <= template["metadata"]["labels"].items()
        assert deployments[service_name]["spec"]["selector"]["matchLabels"] == selector
        ports = {entry["name"]: entry for entry in service["spec"]["ports"]}
        assert ports["grpc"]["port"] == port
        assert ports["grpc"]["appProtocol"] == "grpc"
        assert ports["metrics"]["port"] == METRICS_PORT
        container = template["spec"]["containers"][0]
        container_ports = {entry["name"]: entry["containerPort"] for entry in container["ports"]}
        assert container_ports == {"grpc": port, "metrics": METRICS_PORT}
        env = effective_env(container, docs)
        assert env["TUTTI_LISTEN_ADDRESS"] == f"0.0.0.0:{port}"
        assert env["TUTTI_METRICS_PORT"] == str(METRICS_PORT)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_service_addresses_in_config_resolve_to_services(name: str) -> None:
    """TUTTI_*_ADDRESS values name a rendered Service selecting the service, at its gRPC port.

    A ``dns:///`` address (production, client-side round robin) names a headless Service.
    """
    docs = rendered(name)
    data = config_data(docs)
    services = of_kind(docs, "Service")
    for variable, service in (
        ("TUTTI_HOST_ADDRESS", "host"),
        ("TUTTI_APPCENTER_ADDRESS", "appcenter"),
        ("TUTTI_ISSUEMANAGER_ADDRESS", "issuemanager"),
    ):
        address = data[variable]
        balanced = address.startswith("dns:///")
        target_name, _, port = address.removeprefix("dns:///").partition(":")
        assert int(port) == SERVICES[service], variable
        target = services[target_name]["spec"]
        assert target["selector"] == {"app.kubernetes.io/name": service}, variable
        assert (target.get("clusterIP") == "None") is balanced, variable
        ports = {entry["name"]: entry["port"] for entry in target["ports"]}
        assert ports["grpc"] == SERVICES[service], variable


# --- probes, resources, security, drain ------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_native_grpc_probes_on_the_service_port(name: str) -> None:
    """Liveness, readiness and startup probes are native gRPC health checks on the gRPC port."""
    for service, deployment in of_kind(rendered(name), "Deployment").items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert set(container[probe]) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}
            assert container[probe]["grpc"]["port"] == SERVICES[service], (service, probe)
            # The overall server status: NOT_SERVING until ready and again while draining.
            assert container[probe]["grpc"].get("service", "") == ""


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_container_has_requests_and_limits(name: str) -> None:
    """CPU and memory requests and limits on every container, requests within limits."""
    for owner, template in pod_templates(rendered(name)):
        for container in containers(template):
            resources = container["resources"]
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources[section]), (owner, section)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_pods_are_hardened(name: str) -> None:
    """Non-root, read-only root filesystem (writable /tmp), no privilege escalation, no caps."""
    for owner, template in pod_templates(rendered(name)):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, owner
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", owner
        assert pod.get("hostNetwork") is not True, owner
        assert pod.get("automountServiceAccountToken") is False, owner
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        assert all("hostPath" not in volume for volume in volumes.values()), owner
        for container in containers(template):
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, owner
            assert context["readOnlyRootFilesystem"] is True, owner
            assert context["allowPrivilegeEscalation"] is False, owner
            assert context.get("privileged", False) is False, owner
            assert context["capabilities"]["drop"] == ["ALL"], owner
            assert "add" not in context["capabilities"], owner
            assert context["seccompProfile"]["type"] == "RuntimeDefault", owner
            mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
            # A mount path being checked, not a temporary file being used.
            assert "emptyDir" in volumes[mounts["/tmp"]], owner  # noqa: S108


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_suite_pods_run_as_the_image_user(name: str) -> None:
    """The suite's pods run as the numeric user the image declares."""
    for owner, template in pod_templates(rendered(name)):
        if not containers(template)[0]["image"].startswith(_suite_image(name)):
            continue
        assert template["spec"]["securityContext"]["runAsUser"] == APP_UID, owner
        for container in containers(template):
            assert container["securityContext"]["runAsUser"] == APP_UID, owner


def _suite_image(name: str) -> str:
    """The suite's image name (without tag) in one kustomization."""
    host = of_kind(rendered(name), "Deployment")["host"]
    return split_image(host["spec"]["template"]["spec"]["containers"][0]["image"])[0]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_termination_grace_exceeds_drain_grace(name: str) -> None:
    """terminationGracePeriodSeconds > preStop sleep + TUTTI_GRACE_PERIOD_SECONDS.

    The drain delay (keep answering NOT_SERVING while endpoint removal propagates) is spent
    inside the grace period, and the server caps it at half of it. The kubelet counts the
    termination grace from the start of a preStop hook, so a preStop sleep (production, before
    SIGTERM) adds to what the grace must cover; any other hook would be unbounded.
    """
    docs = rendered(name)
    for service, deployment in of_kind(docs, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = effective_env(container, docs)
        drain = float(env.get("TUTTI_GRACE_PERIOD_SECONDS", DEFAULT_GRACE_SECONDS))
        pre_stop = container.get("lifecycle", {}).get("preStop")
        sleep = 0
        if pre_stop is not None:
            assert set(pre_stop) == {"sleep"}, service
            sleep = pre_stop["sleep"]["seconds"]
        assert pod["terminationGracePeriodSeconds"] > sleep + drain, service
        assert 0 < float(env["TUTTI_DRAIN_DELAY_SECONDS"]) <= drain / 2, service
    livestream = of_kind(docs, "Deployment")["livestream"]["spec"]["template"]["spec"]
    host = of_kind(docs, "Deployment")["host"]["spec"]["template"]["spec"]
    assert livestream["terminationGracePeriodSeconds"] > host["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_tutti_variable_is_a_setting(name: str) -> None:
    """Each TUTTI_* variable names a field of the settings its process reads.

    A Deployment's container is checked against its service's ``Settings``, anything else
    (the migration Job) against ``ServerSettings``; an unknown variable would be ignored.
    """
    docs = rendered(name)
    for owner, template in pod_templates(docs):
        fields = set(ServerSettings.model_fields)
        kind, _, workload = owner.partition("/")
        if kind == "Deployment":
            fields = set(service_settings(workload).model_fields)
        for container in containers(template):
            for variable in effective_env(container, docs):
                if variable.startswith("TUTTI_") and variable not in BUS_VARIABLES:
                    assert variable.removeprefix("TUTTI_").lower() in fields, (owner, variable)


def service_settings(service: str) -> type[ServerSettings]:
    """The settings class of one service (``services/<service>/settings.py``)."""
    settings: type[ServerSettings] = importlib.import_module(
        f"services.{service}.settings"
    ).Settings
    return settings


def test_ports_match_the_settings_defaults() -> None:
    """The manifests' ports are the services' own defaults."""
    assert SERVICES == DEFAULT_PORTS


# --- migrations, database, secrets -----------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_migration_job_runs_tutti_migrate_once(name: str) -> None:
    """A Job runs ``tutti migrate`` against the same database; no Deployment migrates."""
    docs = rendered(name)
    jobs = of_kind(docs, "Job")
    assert list(jobs) == ["tutti-migrate"]
    job = jobs["tutti-migrate"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container.get("command") is None  # the image's ENTRYPOINT is tutti
    assert container["args"] == ["migrate"]
    env = effective_env(container, docs)
    assert env["TUTTI_DATABASE_URL"] == {"secretKeyRef": {"name": "tutti-database", "key": "url"}}
    for deployment in of_kind(docs, "Deployment").values():
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "migrate" not in args


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_database_url_and_tokens_come_from_secrets(name: str) -> None:
    """TUTTI_DATABASE_URL and TUTTI_SERVICE_TOKEN are Secret refs; the ConfigMap holds none."""
    docs = rendered(name)
    data = config_data(docs)
    assert "TUTTI_DATABASE_URL" not in data
    assert "TUTTI_SERVICE_TOKEN" not in data
    for service, deployment in of_kind(docs, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = effective_env(container, docs)
        assert "secretKeyRef" in env["TUTTI_DATABASE_URL"], service
        assert "secretKeyRef" in env["TUTTI_SERVICE_TOKEN"], service
        tokens_dir = Path(env["TUTTI_AUTH_TOKENS_FILE"]).parent
        mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == tokens_dir)
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "tutti-auth-tokens", service
        assert mount["readOnly"] is True


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_secret_references_match_the_template(name: str) -> None:
    """Every Secret and key a workload references is documented in secrets.template.yaml."""
    template = load_secret_template()
    docs = rendered(name)
    for owner, pod_template in pod_templates(docs):
        if not containers(pod_template)[0]["image"].startswith(_suite_image(name)):
            continue
        for container in containers(pod_template):
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in template[ref["name"]]["stringData"], (owner, ref)
        for volume in pod_template["spec"].get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in template, owner
    auth = yaml.safe_load(template["tutti-auth-tokens"]["stringData"]["tokens.yaml"])
    roles = {entry["role"] for entry in auth["tokens"]}
    assert {"service", "admin"} <= roles
    assert all(
        set(entry) == {"subject", "role", "workspaces", "sha256"} for entry in auth["tokens"]
    )


def test_template_database_is_postgres() -> None:
    """The production store is Postgres through psycopg 3."""
    url = load_secret_template()["tutti-database"]["stringData"]["url"]
    assert url.startswith("postgresql+psycopg://")


def test_production_renders_no_secrets() -> None:
    """Production takes its Secrets from the secret manager; nothing secret is in the repo."""
    assert of_kind(rendered("production"), "Secret") == {}


def test_local_overlay_provides_secrets_and_postgres() -> None:
    """Local is self-contained: dev Secrets for every reference, Postgres in-cluster."""
    docs = rendered("local")
    secrets = of_kind(docs, "Secret")
    template = load_secret_template()
    for secret_name, secret in template.items():
        assert set(secret["stringData"]) <= set(secrets[secret_name]["stringData"])
    url = secrets["tutti-database"]["stringData"]["url"]
    assert url.startswith("postgresql+psycopg://")
    # The dev token registry loads with the server's own loader, and the service token in
    # tutti-service-token authenticates as a service principal.
    registry = yaml.safe_load(secrets["tutti-auth-tokens"]["stringData"]["tokens.yaml"])
    tokens = TokenRegistry.from_entries(registry["tokens"])
    service_token = secrets["tutti-service-token"]["stringData"]["token"]
    principal = tokens.authenticate([("authorization", f"Bearer {service_token}")])
    assert principal.role is Role.SERVICE
    assert "@postgres:5432/" in url
    assert of_kind(docs, "StatefulSet")["postgres"]["spec"]["replicas"] == 1
    assert "postgres" in of_kind(docs, "Service")
    assert all(d["spec"]["replicas"] == 1 for d in of_kind(docs, "Deployment").values())


# --- replicas, rollout, disruption -----------------------------------------------------------


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_singletons_run_one_replica_and_recreate(name: str) -> None:
    """Single-replica services never overlap on rollout (host, maintenance outside production)."""
    deployments = of_kind(rendered(name), "Deployment")
    for service in SINGLETONS[name]:
        assert deployments[service]["spec"]["replicas"] == 1, service
        assert deployments[service]["spec"]["strategy"] == {"type": "Recreate"}, service


def test_production_scales_stateless_services_behind_pdbs() -> None:
    """Replicated services run two or more pods, each covered by a PDB that selects them."""
    docs = rendered("production")
    deployments = of_kind(docs, "Deployment")
    budgets = of_kind(docs, "PodDisruptionBudget")
    for service, deployment in deployments.items():
        if service in SINGLETONS["production"]:
            assert service not in budgets
            continue
        assert deployment["spec"]["replicas"] >= 2, service
        budget = budgets[service]["spec"]
        assert budget["minAvailable"] < deployment["spec"]["replicas"], service
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budget["selector"]["matchLabels"].items() <= labels.items(), service
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.spec("SCALE-5")
def test_production_runs_two_maintenance_replicas_behind_a_pdb() -> None:
    """One worker and one standby (ADR 0035); a rollout or node drain keeps one of them."""
    docs = rendered("production")
    deployment = of_kind(docs, "Deployment")["maintenance"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    budget = of_kind(docs, "PodDisruptionBudget")["maintenance"]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"] == {"app.kubernetes.io/name": "maintenance"}


def test_livestream_service_keeps_clients_on_one_replica() -> None:
    """Reconnecting devices prefer the replica that holds their publisher (best effort)."""
    spec = of_kind(rendered("production"), "Service")["livestream"]["spec"]
    assert spec["sessionAffinity"] == "ClientIP"


def test_production_image_is_pinned_and_not_latest() -> None:
    """Production names a registry image with an explicit, non-``latest`` tag or a digest."""
    for _owner, template in pod_templates(rendered("production")):
        for container in containers(template):
            name, tag, digest = split_image(container["image"])
            assert "/" in name, container["image"]
            assert digest or (tag and tag != "latest"), container["image"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlays_use_one_restricted_namespace(name: str) -> None:
    """Every namespaced object lands in the suite's namespace, enforced PSA ``restricted``."""
    docs = rendered(name)
    namespace = of_kind(docs, "Namespace")[NAMESPACE]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, resource_id(doc)


def test_production_disables_reflection() -> None:
    """Server reflection is a development aid; production turns it off."""
    assert config_data(rendered("production"))["TUTTI_REFLECTION"] == "false"


# --- the renderer itself ---------------------------------------------------------------------


def test_strategic_merge_follows_kubernetes_list_semantics() -> None:
    """Containers/env merge by name, ports by containerPort, null deletes, args replace."""
    base = {
        "containers": [
            {
                "name": "app",
                "args": ["serve", "host"],
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                "ports": [{"name": "grpc", "containerPort": 1}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
            }
        ]
    }
    patch = {
        "containers": [
            {
                "name": "app",
                "args": ["serve", "maintenance"],
                "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                "ports": [{"name": "metrics", "containerPort": 2}],
                "resources": {"limits": {"cpu": None}},
            },
            {"name": "sidecar", "image": "x"},
        ]
    }
    merged = strategic_merge(base, patch)
    app, sidecar = merged["containers"]
    assert app["args"] == ["serve", "maintenance"]
    assert app["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "3"},
        {"name": "C", "value": "4"},
    ]
    assert [port["containerPort"] for port in app["ports"]] == [1, 2]
    assert app["resources"] == {"limits": {"memory": "1Gi"}}
    assert sidecar == {"name": "sidecar", "image": "x"}
    assert base["containers"][0]["args"] == ["serve", "host"]  # inputs untouched

    deleted = strategic_merge(base, {"containers": [{"name": "app", "$patch": "delete"}]})
    assert deleted == {"containers": []}


def test_split_image_handles_registry_ports_and_digests() -> None:
    """A registry port is not a tag; a digest is kept apart."""
    assert split_image("tutti") == ("tutti", None, None)
    assert split_image("reg:5000/team/tutti:1.2") == ("reg:5000/team/tutti", "1.2", None)
    assert split_image("reg:5000/tutti@sha256:ab") == ("reg:5000/tutti", None, "sha256:ab")


def test_renderer_refuses_features_it_does_not_implement(tmp_path: Path) -> None:
    """An unsupported kustomization field is an error, never silently dropped."""
    (tmp_path / "kustomization.yaml").write_text(
        "resources: []\nconfigMapGenerator:\n  - name: x\n", encoding="utf-8"
    )
    with pytest.raises(RenderError, match="configMapGenerator"):
        render_python(tmp_path)
