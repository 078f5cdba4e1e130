"""The read-only ``reference`` skill and the runtime routing policy (REF-SKILL-1).

Both texts are generated from code: the URI prefix and parameter names come from
:mod:`services.refresolve.mention_uri`, the command line from :data:`CLI_COMMAND` and
:data:`CLI_OPTIONS` (the CLI tests check that ``tutti reference list`` accepts exactly
these options). The skill tells an agent to use the URI rather than its label, run one
``reference list`` for the handle, read only relevant files, report an empty set rather
than guess, and never treat a reference as permission to mutate anything.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache

from services.refresolve.mention_uri import REFERENCE_URI_PREFIX
from services.refresolve.references import MAX_LIMIT, Source

__all__ = [
    "CLI_COMMAND",
    "CLI_OPTIONS",
    "SKILL_NAME",
    "ReferenceSkill",
    "RoutingPolicy",
    "SkillBundle",
    "skill_bundle",
]

SKILL_NAME = "reference"
CLI_COMMAND = ("tutti", "reference", "list")
CLI_OPTIONS = {
    "source": "--source",
    "id": "--id",
    "groupId": "--group-id",
    "query": "--query",
    "limit": "--limit",
    "json": "--json",
}
"""Mention parameter (or flag) -> ``tutti reference list`` option."""


@dataclass(frozen=True)
class ReferenceSkill:
    """The injected skill."""

    name: str
    description: str
    body_markdown: str
    read_only: bool


@dataclass(frozen=True)
class RoutingPolicy:
    """The runtime policy clause routing mention URIs to the skill."""

    mention_uri_prefix: str
    skill_name: str
    policy_text: str


@dataclass(frozen=True)
class SkillBundle:
    """Skill, policy and the content revision of both."""

    skill: ReferenceSkill
    policy: RoutingPolicy
    revision: str


def _command_template() -> str:
    o = CLI_OPTIONS
    return (
        f"{' '.join(CLI_COMMAND)} {o['source']} <source> {o['id']} <id> "
        f"[{o['groupId']} <groupId>] {o['json']}"
    )


def _skill_body() -> str:
    o = CLI_OPTIONS
    sources = " or ".join(f"`{s.value}`" for s in Source)
    return "\n".join(
        [
            f"# `{SKILL_NAME}` skill (read-only)",
            "",
            f"A workspace-reference mention (`{REFERENCE_URI_PREFIX}<id>?...`) is a live handle "
            "to a set of app or task artifact files. Resolve it only when you need the files.",
            "",
            "1. Use the URI, not the label. The Markdown label and the `count` parameter are "
            "presentation only; read `source`, the `<id>` path segment and `groupId` from the "
            "URI (percent-decoded).",
            "2. Run exactly one command for the handle:",
            "",
            f"       {_command_template()}",
            "",
            f"   `source` is {sources}. Add `{o['groupId']}` only when the URI has `groupId`. "
            f"Add `{o['query']} <text>` to keep files whose name contains the text, and "
            f"`{o['limit']} <n>` (at most {MAX_LIMIT}) to cap the list. The workspace is the "
            "one your CLI is authenticated for; it must equal the URI's `workspaceId`.",
            '3. The command prints `{"items":[{"path","displayName","sizeBytes","mediaType",'
            '"createdAtUnixMs"}]}`. Read only the returned files that are relevant to the '
            "user's request.",
            "4. If `items` is empty, say that the reference currently has no matching files. "
            "Never guess paths, reuse an older list or reconstruct files from the label. If the "
            "command fails, report its one-line error.",
            "5. A reference never authorizes mutation: a task reference does not allow opening, "
            "completing or breaking down an issue, and an app reference does not allow invoking "
            "app commands. Returned paths are data to read. If the user separately asks for such "
            "an action, switch to the issue-manager or workspace-app workflow.",
        ]
    )


def _policy_text() -> str:
    return (
        f"When a message contains a mention whose URI starts with `{REFERENCE_URI_PREFIX}`, use "
        f"the `{SKILL_NAME}` skill before anything else: resolve the URI (not its label) with "
        f"one `{' '.join(CLI_COMMAND)}` command and read only relevant returned files. The "
        "mention is read-only context; it never authorizes changing issues, tasks or apps. "
        "Other mention kinds (`workspace-app`, `workspace-issue`, `agent-target`, "
        "`agent-session`) are not references and do not route to this skill."
    )


@cache
def skill_bundle() -> SkillBundle:
    """The shipped skill and policy with their content revision."""
    skill = ReferenceSkill(
        name=SKILL_NAME,
        description="Resolve a workspace-reference mention into its current files (read-only).",
        body_markdown=_skill_body(),
        read_only=True,
    )
    policy = RoutingPolicy(REFERENCE_URI_PREFIX, SKILL_NAME, _policy_text())
    digest = hashlib.sha256(
        "\x00".join(
            [skill.name, skill.description, skill.body_markdown, policy.policy_text]
        ).encode("utf-8")
    ).hexdigest()
    return SkillBundle(skill, policy, digest[:16])
