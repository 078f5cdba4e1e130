"""``@agent`` and ``/skill:`` resolution of a user draft at send time (HOST-MENT-1..3).

Pure rules: no I/O. The workspace file index is a port (a callable answering whether a
name is a file or folder in the Session's workspace root); a servicer whose index is
asynchronous asks it first for :func:`shadow_candidates` and passes the answers as a
set's ``__contains__``.

Token syntax (the composer serializes chips to exactly this, ADR 0346):

* A token starts at a *word boundary*: at the start of the draft, after whitespace, or
  after an opening bracket or quote (``( [ { < " '``, typographic opening quotes, ``«``).
  ``user@host`` and ``a.@b`` therefore stay text.
* ``@name``: the token body runs to the next whitespace. Closing punctuation at its end
  (``. , ; : ! ? ) ] } > " '``, typographic closing quotes, ``»``) may be dropped, so
  ``(@explorer),`` names ``explorer``; anything else attached (``@explorer.md``,
  ``@explorer's``, a combining mark) makes it a different name. The longest candidate
  that names a catalog subagent wins.
* ``/skill:<id>``: same boundary and body rule; ``<id>`` matches
  ``[A-Za-z0-9]([A-Za-z0-9._:/-]*[A-Za-z0-9])?`` (so trailing punctuation is never part
  of an id) and, when a skill catalog is given, names a catalog
  skill.
* A *leading template or app command* is a draft whose first non-whitespace token is
  ``/<command>`` with ``<command>`` matching ``[A-Za-z][A-Za-z0-9_.-]*`` and followed by
  whitespace or the end (``/review @explorer ...``, ``/compact``); ``/skill:<id>`` is not
  a command. Such a draft keeps its behaviour: nothing in it is rewritten.

Resolution: ``/skill:`` tokens are resolved in every mode. ``@name`` tokens are
delegations only in ``agent`` mode (the only mode that may run ``Task``), when the name
is in the Session's launch catalog and the workspace root holds no file or folder of that
name. In ``plan`` and ``goal`` mode they stay literal text.

The model-facing prompt is a short instruction (skills load first, then delegation with
``Task``) followed by the unchanged draft; ``@name`` tokens stay in it so each brief can be
written from the part addressed to it. The stored user row keeps the typed draft as
``command`` with the mentions' UTF-16 offsets (``start`` at the ``@`` or ``/``, ``end``
exclusive).

Public API:
    ComposerMode: ``agent`` | ``plan`` | ``goal``.
    Subagent(name, description): one launch-catalog entry.
    AgentMention(start, end, name), SkillMention(start, end, skill_id): stored mentions.
    MentionResolution(prompt, command, skill_mentions, agent_mentions): a rewrite.
    MentionMenu(agents, shadowed_names, unavailable_reason): the ``@`` menu's Agents group.
    WorkspaceFileIndex: ``Callable[[str], bool]`` port.
    leading_command(draft) -> str | None
    shadow_candidates(draft, *, mode, subagents) -> frozenset[str]
    resolve_mentions(draft, *, mode, subagents, is_workspace_entry, skills=None)
        -> MentionResolution | None   (None: no rewrite, send the draft as typed)
    build_prompt(draft, *, skill_ids, agent_names) -> str
    mention_menu(subagents, *, mode, is_workspace_entry) -> MentionMenu
    valid_agent_mentions(command, mentions) -> tuple[AgentMention, ...]
    valid_skill_mentions(command, mentions) -> tuple[SkillMention, ...]
    encode_agent_mentions / decode_agent_mentions, encode_skill_mentions /
        decode_skill_mentions: the stored JSON columns (camelCase; ``None`` when empty).
    utf16_length(text) -> int
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

__all__ = [
    "AgentMention",
    "ComposerMode",
    "MentionMenu",
    "MentionResolution",
    "SkillMention",
    "Subagent",
    "WorkspaceFileIndex",
    "build_prompt",
    "decode_agent_mentions",
    "decode_skill_mentions",
    "encode_agent_mentions",
    "encode_skill_mentions",
    "leading_command",
    "mention_menu",
    "resolve_mentions",
    "shadow_candidates",
    "utf16_length",
    "valid_agent_mentions",
    "valid_skill_mentions",
]

WorkspaceFileIndex = Callable[[str], bool]
"""Port: ``is_workspace_entry(name)`` is true when the workspace root holds a file or
folder called ``name``. It may raise (for example ``domainerrors.Unavailable``); the
error propagates unchanged."""

SKILL_PREFIX = "/skill:"
_OPENERS = frozenset("([{<\"'\u201c\u2018\u00ab")
_CLOSERS = frozenset(".,;:!?)]}>\"'\u201d\u2019\u00bb")
_SKILL_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:/-]*[A-Za-z0-9])?")
_LEADING_COMMAND = re.compile(r"\s*/([A-Za-z][A-Za-z0-9_.-]*)(?=\s|\Z)")


class ComposerMode(StrEnum):
    """The composer mode of a submission; the wire's unspecified value means ``agent``."""

    AGENT = "agent"
    PLAN = "plan"
    GOAL = "goal"


@dataclass(frozen=True)
class Subagent:
    """One entry of the subagent catalog a Session was launched with."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class AgentMention:
    """A delegation token: UTF-16 ``start`` at the ``@``, ``end`` exclusive."""

    start: int
    end: int
    name: str


@dataclass(frozen=True)
class SkillMention:
    """A ``/skill:<id>`` token: UTF-16 ``start`` at the ``/``, ``end`` exclusive."""

    start: int
    end: int
    skill_id: str


@dataclass(frozen=True)
class MentionResolution:
    """A rewritten submission.

    Attributes:
        prompt: the model-facing prompt (instruction + unchanged draft); never shown to
            users and never restored into a composer.
        command: the typed draft, stored on the user row.
        skill_mentions: resolved ``/skill:`` tokens in draft order.
        agent_mentions: resolved ``@name`` delegations in draft order.
    """

    prompt: str
    command: str
    skill_mentions: tuple[SkillMention, ...]
    agent_mentions: tuple[AgentMention, ...]


@dataclass(frozen=True)
class MentionMenu:
    """The ``@`` menu's Agents group: catalog order, minus shadowed names.

    ``unavailable_reason`` is set (``WORKSPACE_INDEX_UNAVAILABLE`` or
    ``CATALOG_UNAVAILABLE``) when a read behind the group failed; the group is then empty,
    never unshadowed or partly filtered (HOST-MENT-4).
    """

    agents: tuple[Subagent, ...]
    shadowed_names: tuple[str, ...]
    unavailable_reason: str | None = None


# ---------------------------------------------------------------------------- UTF-16


def _units(char: str) -> int:
    # Code points above the BMP are a surrogate pair in UTF-16.
    return 2 if ord(char) > 0xFFFF else 1


def utf16_length(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (what JavaScript's ``length`` reports)."""
    return sum(_units(char) for char in text)


def _utf16_offsets(text: str) -> list[int]:
    """``offsets[i]`` is the UTF-16 offset of code point ``i``; ``offsets[len]`` the total."""
    offsets = [0] * (len(text) + 1)
    total = 0
    for index, char in enumerate(text):
        offsets[index] = total
        total += _units(char)
    offsets[len(text)] = total
    return offsets


# ---------------------------------------------------------------------------- tokens


def _at_boundary(text: str, index: int) -> bool:
    return index == 0 or text[index - 1].isspace() or text[index - 1] in _OPENERS


class _Runs:
    """Whitespace-free runs of a text, with the last run's bounds cached.

    A token body runs to the next whitespace and may end in closing punctuation.
    Positions are asked in increasing order, so caching one run keeps a scan linear even
    for adversarial drafts such as ``(@(@(@...`` without whitespace.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._low, self._end, self._core = 0, -1, 0

    def bounds(self, index: int) -> tuple[int, int]:
        """``(end, core)`` for a body starting at ``index``.

        ``end`` is the first whitespace at or after ``index`` (or the text's end);
        ``text[core:end]`` is its trailing closing punctuation, ``index <= core <= end``.
        """
        if not self._low <= index <= self._end:
            text = self._text
            end = index
            while end < len(text) and not text[end].isspace():
                end += 1
            core = end
            while core > index and text[core - 1] in _CLOSERS:
                core -= 1
            self._low, self._end, self._core = index, end, core
        return self._end, max(index, self._core)


def _match_at(
    text: str, runs: _Runs, start: int, accept: Callable[[str], bool], max_length: int
) -> str | None:
    """The longest name at ``start`` that ``accept`` takes.

    The name must be followed only by closing punctuation up to the next whitespace.
    """
    end, core = runs.bounds(start)
    for length in range(min(end - start, max_length), max(core - start, 1) - 1, -1):
        candidate = text[start : start + length]
        if accept(candidate):
            return candidate
    return None


@dataclass(frozen=True)
class _Token:
    kind: str  # "agent" | "skill"
    start: int  # code point index of "@" or "/"
    end: int  # code point index after the name
    name: str


@dataclass(frozen=True)
class _Vocabulary:
    """What a scan may accept, with the longest acceptable length (bounds the work)."""

    accept: Callable[[str], bool]
    max_length: int


def _scan(draft: str, *, agents: _Vocabulary | None, skills: _Vocabulary | None) -> list[_Token]:
    """Tokens in draft order; a ``None`` vocabulary skips that token kind."""
    tokens: list[_Token] = []
    runs = _Runs(draft)
    index = 0
    while index < len(draft):
        char = draft[index]
        if char == "@" and agents is not None and _at_boundary(draft, index):
            name = _match_at(draft, runs, index + 1, agents.accept, agents.max_length)
            if name is not None:
                tokens.append(_Token("agent", index, index + 1 + len(name), name))
                index += 1 + len(name)
                continue
        if (
            char == "/"
            and skills is not None
            and draft.startswith(SKILL_PREFIX, index)
            and _at_boundary(draft, index)
        ):
            body_start = index + len(SKILL_PREFIX)
            skill_id = _match_at(draft, runs, body_start, skills.accept, skills.max_length)
            if skill_id is not None:
                tokens.append(_Token("skill", index, body_start + len(skill_id), skill_id))
                index = body_start + len(skill_id)
                continue
        # No token here; one may still start inside this body, after an opener.
        index += 1
    return tokens


MAX_SKILL_ID_LENGTH = 256
"""Longest ``/skill:`` id accepted when no skill catalog is given."""


def _skill_vocabulary(skills: Iterable[str] | None) -> _Vocabulary:
    known = None if skills is None else frozenset(skills)

    def accept(candidate: str) -> bool:
        if _SKILL_ID.fullmatch(candidate) is None:
            return False
        return known is None or candidate in known

    longest = MAX_SKILL_ID_LENGTH if known is None else max(map(len, known), default=0)
    return _Vocabulary(accept, longest)


def _agent_vocabulary(names: frozenset[str], accept: Callable[[str], bool]) -> _Vocabulary:
    return _Vocabulary(accept, max(map(len, names), default=0))


def leading_command(draft: str) -> str | None:
    """The name of a leading template or app command (``/review ...`` → ``"review"``).

    ``/skill:<id>`` is never a command. Returns ``None`` when the draft does not start
    with a command.
    """
    match = _LEADING_COMMAND.match(draft)
    return None if match is None else match.group(1)


def shadow_candidates(
    draft: str, *, mode: ComposerMode, subagents: Iterable[Subagent]
) -> frozenset[str]:
    """Catalog names the draft mentions, i.e. the names the file index must be asked about.

    Empty outside agent mode and for a draft with a leading command.
    """
    if mode is not ComposerMode.AGENT or leading_command(draft) is not None:
        return frozenset()
    catalog = frozenset(agent.name for agent in subagents)
    tokens = _scan(draft, agents=_agent_vocabulary(catalog, catalog.__contains__), skills=None)
    return frozenset(token.name for token in tokens)


def resolve_mentions(
    draft: str,
    *,
    mode: ComposerMode,
    subagents: Iterable[Subagent],
    is_workspace_entry: WorkspaceFileIndex,
    skills: Iterable[str] | None = None,
) -> MentionResolution | None:
    """Resolve a draft's ``/skill:`` and ``@name`` tokens (HOST-MENT-1..3).

    Args:
        draft: the typed text, exactly as the user submitted it.
        mode: the composer mode; only ``agent`` resolves ``@name`` delegations.
        subagents: the subagent catalog of the Session's launch.
        is_workspace_entry: the workspace file-index port; asked only about catalog
            names the draft mentions in agent mode.
        skills: the known skill ids; ``None`` accepts any well-formed id.

    Returns:
        The rewrite, or ``None`` when nothing is rewritten (no resolved token, or a
        leading template/app command): the draft is then sent and stored as typed.
    """
    if leading_command(draft) is not None:
        return None
    catalog = frozenset(agent.name for agent in subagents)
    shadowed: dict[str, bool] = {}

    def is_delegation(name: str) -> bool:
        if name not in catalog:
            return False
        if name not in shadowed:
            shadowed[name] = bool(is_workspace_entry(name))
        return not shadowed[name]

    tokens = _scan(
        draft,
        agents=_agent_vocabulary(catalog, is_delegation) if mode is ComposerMode.AGENT else None,
        skills=_skill_vocabulary(skills),
    )
    if not tokens:
        return None
    offsets = _utf16_offsets(draft)
    skill_mentions = tuple(
        SkillMention(offsets[t.start], offsets[t.end], t.name) for t in tokens if t.kind == "skill"
    )
    agent_mentions = tuple(
        AgentMention(offsets[t.start], offsets[t.end], t.name) for t in tokens if t.kind == "agent"
    )
    prompt = build_prompt(
        draft,
        skill_ids=[mention.skill_id for mention in skill_mentions],
        agent_names=[mention.name for mention in agent_mentions],
    )
    return MentionResolution(prompt, draft, skill_mentions, agent_mentions)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def build_prompt(draft: str, *, skill_ids: Sequence[str], agent_names: Sequence[str]) -> str:
    """The model-facing prompt: skill loading first, then delegation, then the draft.

    Names are listed once each, in order of first mention. The draft follows unchanged
    after a blank line and a ``User request:`` label. Host never enforces the ``Task``
    call; this is a strong prompt (HOST-MENT-2).
    """
    lines: list[str] = []
    skills = _unique(skill_ids)
    agents = _unique(agent_names)
    if skills:
        listed = ", ".join(f"`{skill}`" for skill in skills)
        lines.append(
            f"Before doing anything else, load these skills with the Skill tool, "
            f"in this order: {listed}."
        )
    if agents:
        listed = ", ".join(f"`@{agent}`" for agent in agents)
        lead = "Then delegate" if skills else "Delegate"
        lines.append(
            f"{lead} with the Task tool: call Task for each of these subagents: {listed}. "
            "Write each subagent's brief from the part of the request below addressed to it."
        )
    return "\n".join(lines) + "\n\nUser request:\n" + draft


def mention_menu(
    subagents: Iterable[Subagent], *, mode: ComposerMode, is_workspace_entry: WorkspaceFileIndex
) -> MentionMenu:
    """The ``@`` menu's Agents group (HOST-MENT-1).

    Outside agent mode the group is empty (plan and goal cannot delegate). A catalog
    name shadowed by a file or folder in the workspace root is hidden and listed in
    ``shadowed_names``; catalog order is kept and duplicate names appear once.
    """
    if mode is not ComposerMode.AGENT:
        return MentionMenu((), ())
    agents: list[Subagent] = []
    shadowed: list[str] = []
    seen: set[str] = set()
    for agent in subagents:
        if agent.name in seen:
            continue
        seen.add(agent.name)
        if is_workspace_entry(agent.name):
            shadowed.append(agent.name)
        else:
            agents.append(agent)
    return MentionMenu(tuple(agents), tuple(shadowed))


# ---------------------------------------------------------------------------- validation


def _positions(text: str) -> dict[int, int]:
    """UTF-16 offset → code point index, for offsets on code point boundaries only."""
    return {offset: index for index, offset in enumerate(_utf16_offsets(text))}


def _token_at(
    text: str, positions: dict[int, int], runs: _Runs, span: tuple[int, int], prefix: str
) -> str | None:
    """The name a stored UTF-16 ``[start, end)`` span denotes, if it is a well-formed token."""
    # A span that splits a surrogate pair or leaves the text has no position.
    first, last = positions.get(span[0]), positions.get(span[1])
    if first is None or last is None or first + len(prefix) >= last:
        return None
    if not text.startswith(prefix, first) or not _at_boundary(text, first):
        return None
    name_start = first + len(prefix)
    end, core = runs.bounds(name_start)
    # The name must reach the trailing punctuation of its run (and not pass the run).
    if not core <= last <= end:
        return None
    return text[name_start:last]


_M = TypeVar("_M", AgentMention, SkillMention)


def _non_overlapping(mentions: Iterable[_M]) -> tuple[_M, ...]:
    kept: list[_M] = []
    for mention in sorted(mentions, key=lambda m: (m.start, m.end)):
        if kept and mention.start < kept[-1].end:
            continue
        kept.append(mention)
    return tuple(kept)


def valid_agent_mentions(
    command: str, mentions: Iterable[AgentMention]
) -> tuple[AgentMention, ...]:
    """Stored agent mentions that point at an ``@name`` token of ``command``.

    Others render as plain text (HOST-MENT-3): the span must lie on code point
    boundaries, start with ``@`` at a word boundary, contain exactly ``@`` + ``name`` and
    be followed only by closing punctuation up to the next whitespace. Overlapping spans
    keep the first. The result is sorted by ``start``.
    """
    positions, runs = _positions(command), _Runs(command)
    valid = [
        mention
        for mention in sorted(mentions, key=lambda m: (m.start, m.end))
        if _token_at(command, positions, runs, (mention.start, mention.end), "@") == mention.name
    ]
    return _non_overlapping(valid)


def valid_skill_mentions(
    command: str, mentions: Iterable[SkillMention]
) -> tuple[SkillMention, ...]:
    """Stored skill mentions that point at a ``/skill:<id>`` token of ``command``."""
    positions, runs = _positions(command), _Runs(command)
    valid = [
        mention
        for mention in sorted(mentions, key=lambda m: (m.start, m.end))
        if _token_at(command, positions, runs, (mention.start, mention.end), SKILL_PREFIX)
        == mention.skill_id
    ]
    return _non_overlapping(valid)


# ---------------------------------------------------------------------------- storage


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encode_agent_mentions(mentions: Sequence[AgentMention]) -> str | None:
    """JSON for ``messages.agent_mentions_json``: ``[{"start","end","name"}]``.

    Returns ``None`` (the column stays unset) when there are no mentions.
    """
    if not mentions:
        return None
    return _dumps([{"start": m.start, "end": m.end, "name": m.name} for m in mentions])


def encode_skill_mentions(mentions: Sequence[SkillMention]) -> str | None:
    """JSON for ``messages.skill_mentions_json``: ``[{"start","end","skillId"}]``.

    Returns ``None`` (the column stays unset) when there are no mentions.
    """
    if not mentions:
        return None
    return _dumps([{"start": m.start, "end": m.end, "skillId": m.skill_id} for m in mentions])


def _entries(raw: str | None) -> list[dict[str, Any]]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    return [entry for entry in value if isinstance(entry, dict)]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def decode_agent_mentions(raw: str | None) -> tuple[AgentMention, ...]:
    """Read ``messages.agent_mentions_json``; a row without the field reads back as ``()``.

    Malformed entries are skipped (they would render as text anyway).
    """
    decoded: list[AgentMention] = []
    for entry in _entries(raw):
        start, end, name = _int(entry.get("start")), _int(entry.get("end")), entry.get("name")
        if start is not None and end is not None and isinstance(name, str):
            decoded.append(AgentMention(start, end, name))
    return tuple(decoded)


def decode_skill_mentions(raw: str | None) -> tuple[SkillMention, ...]:
    """Read ``messages.skill_mentions_json``; a row without the field reads back as ``()``."""
    decoded: list[SkillMention] = []
    for entry in _entries(raw):
        start, end = _int(entry.get("start")), _int(entry.get("end"))
        skill_id = entry.get("skillId")
        if start is not None and end is not None and isinstance(skill_id, str):
            decoded.append(SkillMention(start, end, skill_id))
    return tuple(decoded)
