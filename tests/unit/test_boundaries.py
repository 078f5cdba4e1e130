"""Package boundaries hold (ARCH-2, ARCH-5; STYLE.md "Boundaries" and "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "app.py").exists())

# Store models each service may touch; host owns the canonical tables (ARCH-2).
ALLOWED_MODELS = {
    "maintenance": {"MaintenancePreference", "MaintenanceMarker", "MaintenanceCleanupAttempt"},
    "appcenter": {"AppCenterApp", "AppCenterGroup", "AppCenterArtifact"},
    "issuemanager": {"IssueManagerTopic", "IssueManagerIssue", "IssueManagerOutput"},
    "refresolve": set(),
    "livestream": set(),
}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    tree = ast.parse(path.read_text())
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


@pytest.mark.spec("ARCH-5")
def test_no_vague_shared_packages() -> None:
    vague = {"common", "utils", "helpers", "util", "misc", "shared"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    packages |= {p.name for p in (ROOT / "services").iterdir() if p.is_dir()}
    assert not packages & vague


@pytest.mark.spec("ARCH-1", "ARCH-2")
@pytest.mark.parametrize("service", SERVICES)
def test_a_service_never_imports_another_service_or_foreign_tables(service: str) -> None:
    for path in (ROOT / "services" / service).rglob("*.py"):
        for module, names in _imports(path):
            if module.startswith("services."):
                assert module.split(".")[1] == service, f"{path} imports {module}"
            if module == "store.models" and service != "host":
                foreign = set(names) - ALLOWED_MODELS[service]
                assert not foreign, f"{path} touches tables it does not own: {foreign}"


@pytest.mark.spec("ARCH-5")
def test_domain_errors_and_store_never_import_grpc() -> None:
    for package in ("domainerrors", "store"):
        for path in (ROOT / package).rglob("*.py"):
            for module, _ in _imports(path):
                assert not module.startswith(("grpc", "agentactivity")), f"{path}: {module}"
                assert not module.startswith("services"), f"{path}: the store knows no service"


@pytest.mark.spec("ARCH-2")
def test_livestream_reads_host_only_through_its_generated_client_and_the_source() -> None:
    """livestream imports nothing of Host but its generated client, and only the narrow
    source module does (ADR 0019); the device-side Subscriber imports no server code."""
    livestream = ROOT / "services" / "livestream"
    for path in livestream.rglob("*.py"):
        for module, names in _imports(path):
            assert not module.startswith("store"), f"{path}: livestream has no store"
            if module.startswith("agentactivity.host") and path.name != "source.py":
                # Outside the source only the feed's event types: no Host RPC is called.
                where = f"{path} reads Host outside the source: {module} {names}"
                assert module == "agentactivity.host.v1", where
                assert set(names) <= {"activity_pb2"}, where
            if path.parent.name == "subscriber" and module.startswith("services."):
                assert module.startswith("services.livestream.subscriber"), f"{path}: {module}"


@pytest.mark.spec("ARCH-5", "MAINT-OUT-1")
def test_session_resources_know_no_service_no_store_and_no_wire() -> None:
    """The resource layout is shared by the demo runtime (which creates) and maintenance
    (which releases), so it depends on neither, nor on the store or generated types."""
    for path in (ROOT / "session_resources").rglob("*.py"):
        for module, _ in _imports(path):
            assert not module.startswith(("services", "store", "grpc", "agentactivity")), (
                f"{path}: {module}"
            )
