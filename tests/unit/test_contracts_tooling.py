"""The contracts lint clean and the checked-in stubs match the protos (CON-1, CON-2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "tools" / "buf" / "node_modules" / ".bin" / "buf"


@pytest.mark.spec("CON-1")
def test_generated_stubs_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.spec("CON-2")
def test_buf_lint_is_clean() -> None:
    assert BUF.exists(), "buf missing: `scripts/install --dev` installs it from the npm registry"
    result = subprocess.run(
        [str(BUF), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.spec("CON-1", "CON-7")
def test_every_contract_is_versioned_and_reuses_the_canonical_vocabulary() -> None:
    protos = sorted((ROOT / "proto" / "agentactivity").rglob("*.proto"))
    assert protos
    canonical_enums = (
        "enum TurnPhase",
        "enum TurnOutcome",
        "enum TurnOrigin",
        "enum InteractionKind",
        "enum InteractionStatus",
    )
    for proto in protos:
        text = proto.read_text()
        relative = proto.relative_to(ROOT / "proto").parent.as_posix().replace("/", ".")
        assert f"package {relative};" in text, proto
        assert relative.endswith(".v1"), proto
        if "canonical" not in relative:
            for enum in canonical_enums:
                assert enum not in text, f"{proto} redefines {enum}"
            for entity in ("Session", "Turn", "Message", "Interaction"):
                assert f"\nmessage {entity} {{" not in text, f"{proto} redefines {entity}"
