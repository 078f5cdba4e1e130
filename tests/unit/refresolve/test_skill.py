"""The shipped read-only ``reference`` skill and its routing policy (REF-SKILL-1)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from services.refresolve.mention_uri import REFERENCE_URI_PREFIX
from services.refresolve.skill import CLI_COMMAND, CLI_OPTIONS, SKILL_NAME, skill_bundle
from tutti.cli import app


@pytest.mark.spec("REF-SKILL-1")
def test_the_skill_states_every_rule_of_the_protocol() -> None:
    bundle = skill_bundle()
    body = bundle.skill.body_markdown
    assert bundle.skill.name == SKILL_NAME == "reference"
    assert bundle.skill.read_only
    assert "Use the URI, not the label" in body
    assert "Run exactly one command" in body
    assert "Read only the returned files that are relevant" in body
    assert "has no matching files. Never guess" in body
    assert "never authorizes mutation" in body
    command = re.search(r"^\s+(tutti reference list .*)$", body, re.MULTILINE)
    assert command is not None
    assert command.group(1) == "tutti reference list --source <source> --id <id> " + (
        "[--group-id <groupId>] --json"
    )


@pytest.mark.spec("REF-SKILL-1")
def test_the_policy_routes_the_mention_prefix_to_the_skill() -> None:
    policy = skill_bundle().policy
    assert policy.mention_uri_prefix == REFERENCE_URI_PREFIX == "mention://workspace-reference/"
    assert policy.skill_name == "reference"
    assert REFERENCE_URI_PREFIX in policy.policy_text
    assert "never authorizes" in policy.policy_text
    for other in ("workspace-app", "workspace-issue", "agent-target", "agent-session"):
        assert other in policy.policy_text
    assert re.fullmatch(r"[0-9a-f]{16}", skill_bundle().revision)


@pytest.mark.spec("REF-SKILL-1", "REF-CLI-1")
def test_the_skill_command_matches_the_real_cli() -> None:
    result = CliRunner().invoke(app, [*CLI_COMMAND[1:], "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    offered = set(re.findall(r"(--[a-z][a-z-]*)", result.output))
    assert set(CLI_OPTIONS.values()) <= offered
