"""``@agent`` / ``/skill:`` resolution, UTF-16 offsets and the ``@`` menu (HOST-MENT-1..3)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domainerrors import Unavailable
from services.host.turns.mentions import (
    AgentMention,
    ComposerMode,
    MentionResolution,
    SkillMention,
    Subagent,
    build_prompt,
    decode_agent_mentions,
    decode_skill_mentions,
    encode_agent_mentions,
    encode_skill_mentions,
    leading_command,
    mention_menu,
    resolve_mentions,
    shadow_candidates,
    utf16_length,
    valid_agent_mentions,
    valid_skill_mentions,
)

CATALOG = (
    Subagent("explorer", "Finds code"),
    Subagent("reviewer", "Reviews changes"),
    Subagent("code", "Short name"),
    Subagent("code-reviewer", "Longer name sharing a prefix"),
)


def no_files(name: str) -> bool:
    return False


def utf16_slice(text: str, start: int, end: int) -> str:
    return text.encode("utf-16-le")[2 * start : 2 * end].decode("utf-16-le")


def resolve(
    draft: str,
    mode: ComposerMode = ComposerMode.AGENT,
    files: Callable[[str], bool] = no_files,
    skills: list[str] | None = None,
) -> MentionResolution | None:
    return resolve_mentions(
        draft, mode=mode, subagents=CATALOG, is_workspace_entry=files, skills=skills
    )


# ---------------------------------------------------------------------------- HOST-MENT-1


@pytest.mark.spec("HOST-MENT-1", "HOST-MENT-3")
def test_a_catalog_name_at_a_word_boundary_is_a_delegation() -> None:
    result = resolve_mentions(
        "ask @explorer where the retry policy lives",
        mode=ComposerMode.AGENT,
        subagents=CATALOG,
        is_workspace_entry=no_files,
    )
    assert result is not None
    assert result.agent_mentions == (AgentMention(4, 13, "explorer"),)
    assert result.skill_mentions == ()
    assert result.command == "ask @explorer where the retry policy lives"


@pytest.mark.spec("HOST-MENT-1")
@pytest.mark.parametrize(
    "draft",
    [
        "mail user@explorer today",
        "a.@explorer",
        "path/@explorer",
        "ask @nobody please",
        "ask @explorer.md please",
        "ask @explorer's notes",
        "ask @explorer\u0301 now",
        "ask @@explorer",
        "ask @ explorer",
        "",
    ],
)
def test_text_that_is_not_a_delegation_is_not_rewritten(draft: str) -> None:
    assert resolve(draft) is None


@pytest.mark.spec("HOST-MENT-1", "HOST-MENT-3")
@pytest.mark.parametrize(
    ("draft", "start", "end"),
    [
        ("(@explorer), then", 1, 10),
        ("@explorer: look", 0, 9),
        ("“@explorer” look", 1, 10),
        ("ask @explorer.", 4, 13),
        ("ask\n@explorer?!", 4, 13),
        ("😀 @explorer", 3, 12),  # the emoji is a surrogate pair: two UTF-16 units
        ("see@x(@explorer)", 6, 15),  # a token may start after an opener inside a word
    ],
)
def test_adjacent_punctuation_and_openers(draft: str, start: int, end: int) -> None:
    result = resolve(draft)
    assert result is not None
    assert result.agent_mentions == (AgentMention(start, end, "explorer"),)
    assert utf16_slice(draft, start, end) == "@explorer"


@pytest.mark.spec("HOST-MENT-1")
def test_the_longest_catalog_name_wins() -> None:
    result = resolve("@code-reviewer and @code.")
    assert result is not None
    assert [m.name for m in result.agent_mentions] == ["code-reviewer", "code"]


@pytest.mark.spec("HOST-MENT-1")
@pytest.mark.parametrize("mode", [ComposerMode.PLAN, ComposerMode.GOAL])
def test_plan_and_goal_mode_keep_mentions_literal(mode: ComposerMode) -> None:
    asked: list[str] = []

    def index(name: str) -> bool:
        asked.append(name)
        return False

    assert resolve("ask @explorer now", mode=mode, files=index) is None
    assert asked == []  # no file-index read is needed outside agent mode


@pytest.mark.spec("HOST-MENT-1")
def test_a_name_shadowed_by_a_workspace_file_or_folder_stays_text() -> None:
    asked: list[str] = []

    def index(name: str) -> bool:
        asked.append(name)
        return name == "explorer"

    result = resolve("@explorer and @reviewer and @explorer and user@reviewer", files=index)
    assert result is not None
    assert [m.name for m in result.agent_mentions] == ["reviewer"]
    # Only catalog names the draft mentions are looked up, each once.
    assert asked == ["explorer", "reviewer"]


@pytest.mark.spec("HOST-MENT-1")
def test_a_failing_file_index_propagates() -> None:
    def index(name: str) -> bool:
        raise Unavailable("index down", reason="WORKSPACE_INDEX_UNAVAILABLE")

    with pytest.raises(Unavailable):
        resolve("@explorer", files=index)


@pytest.mark.spec("HOST-MENT-1")
def test_shadow_candidates_lists_what_the_index_must_answer() -> None:
    draft = "@explorer, @reviewer, user@code, @nobody"
    assert shadow_candidates(draft, mode=ComposerMode.AGENT, subagents=CATALOG) == {
        "explorer",
        "reviewer",
    }
    assert shadow_candidates(draft, mode=ComposerMode.PLAN, subagents=CATALOG) == frozenset()
    assert shadow_candidates("/review " + draft, mode=ComposerMode.AGENT, subagents=CATALOG) == (
        frozenset()
    )
    # A pre-fetched answer set plugs in as the port.
    result = resolve(draft, files=frozenset({"explorer"}).__contains__)
    assert result is not None
    assert [m.name for m in result.agent_mentions] == ["reviewer"]


@pytest.mark.spec("HOST-MENT-1")
def test_the_menu_hides_shadowed_names_and_is_empty_outside_agent_mode() -> None:
    catalog = (*CATALOG, Subagent("explorer", "duplicate entry"))
    menu = mention_menu(
        catalog, mode=ComposerMode.AGENT, is_workspace_entry=lambda name: name == "reviewer"
    )
    assert [a.name for a in menu.agents] == ["explorer", "code", "code-reviewer"]
    assert menu.agents[0].description == "Finds code"
    assert menu.shadowed_names == ("reviewer",)
    for mode in (ComposerMode.PLAN, ComposerMode.GOAL):
        empty = mention_menu(catalog, mode=mode, is_workspace_entry=no_files)
        assert empty.agents == ()
        assert empty.shadowed_names == ()


@pytest.mark.spec("HOST-MENT-1", "HOST-MENT-3")
def test_scanning_stays_linear_on_adversarial_drafts() -> None:
    drafts = [
        "(@" * 200_000,
        "@" + "(" * 200_000,
        " @explorer" + ")" * 200_000 + "x",
        "(/skill:" * 100_000,
    ]
    started = time.monotonic()
    for draft in drafts:
        resolve(draft)
        valid_agent_mentions(
            draft, [AgentMention(i, i + 9, "explorer") for i in range(0, 50_000, 7)]
        )
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------------------- HOST-MENT-2


@pytest.mark.spec("HOST-MENT-2")
def test_the_prompt_instructs_task_then_carries_the_unchanged_draft() -> None:
    draft = "@explorer find the retry policy; @reviewer check it. @explorer again"
    result = resolve(draft)
    assert result is not None
    instruction, unchanged = result.prompt.split("\n\nUser request:\n", 1)
    assert unchanged == draft
    assert "Task" in instruction
    # Each agent is named once, in order of first mention.
    assert instruction.count("`@explorer`") == 1
    assert instruction.index("`@explorer`") < instruction.index("`@reviewer`")


@pytest.mark.spec("HOST-MENT-2", "HOST-MENT-3")
def test_skills_load_first_then_delegation() -> None:
    draft = "@explorer use /skill:pdf-tools and /skill:review."
    result = resolve(draft)
    assert result is not None
    assert result.skill_mentions == (
        SkillMention(14, 30, "pdf-tools"),
        SkillMention(35, 48, "review"),
    )
    assert utf16_slice(draft, 14, 30) == "/skill:pdf-tools"
    assert result.agent_mentions == (AgentMention(0, 9, "explorer"),)
    lines = result.prompt.split("\n")
    assert "Skill tool" in lines[0]
    assert "`pdf-tools`, `review`" in lines[0]
    assert lines[1].startswith("Then delegate with the Task tool")
    assert result.prompt.endswith("\n\nUser request:\n" + draft)


@pytest.mark.spec("HOST-MENT-2")
def test_skills_resolve_in_plan_mode_but_agents_stay_literal() -> None:
    result = resolve("/skill:pdf then @explorer", mode=ComposerMode.PLAN)
    assert result is not None
    assert [m.skill_id for m in result.skill_mentions] == ["pdf"]
    assert result.agent_mentions == ()
    assert "Task" not in result.prompt.split("\n\nUser request:\n")[0]


@pytest.mark.spec("HOST-MENT-2")
def test_a_skill_catalog_restricts_skill_ids() -> None:
    assert resolve("/skill:unknown", skills=["pdf"]) is None
    assert resolve("x/skill:pdf", skills=["pdf"]) is None  # not at a word boundary
    assert resolve("/skill:-bad") is None  # malformed id
    assert resolve("/skill:a.") is not None
    result = resolve("/skill:pdf,", skills=["pdf"])
    assert result is not None
    assert result.skill_mentions == (SkillMention(0, 10, "pdf"),)


@pytest.mark.spec("HOST-MENT-2")
@pytest.mark.parametrize(
    ("draft", "command"),
    [
        ("/review @explorer look", "review"),
        ("  /compact", "compact"),
        ("/my-template\n@explorer", "my-template"),
    ],
)
def test_a_leading_template_or_app_command_is_not_rewritten(draft: str, command: str) -> None:
    assert leading_command(draft) == command
    assert resolve(draft) is None
    assert resolve(draft + " /skill:pdf") is None


@pytest.mark.spec("HOST-MENT-2")
@pytest.mark.parametrize(
    "draft", ["/skill:pdf @explorer", "/usr/bin is missing", "a /review", "/1x"]
)
def test_what_is_not_a_leading_command(draft: str) -> None:
    assert leading_command(draft) is None


@pytest.mark.spec("HOST-MENT-2")
def test_build_prompt_without_skills_starts_with_delegation() -> None:
    prompt = build_prompt("hi @a", skill_ids=[], agent_names=["a", "a"])
    assert prompt.startswith("Delegate with the Task tool")
    assert prompt.count("`@a`") == 1
    assert prompt.endswith("hi @a")


# ---------------------------------------------------------------------------- HOST-MENT-3


@pytest.mark.spec("HOST-MENT-3")
def test_utf16_offsets_count_surrogate_pairs_and_combining_marks() -> None:
    draft = "e\u0301 \U0001d4b3 😀👍🏽 @reviewer"
    result = resolve(draft)
    assert result is not None
    (mention,) = result.agent_mentions
    assert mention.start == utf16_length(draft) - len("@reviewer")
    assert utf16_slice(draft, mention.start, mention.end) == "@reviewer"


@pytest.mark.spec("HOST-MENT-3")
def test_stored_offsets_that_do_not_point_at_an_at_token_render_as_text() -> None:
    command = "😀 @explorer and user@reviewer, @reviewer"
    good = AgentMention(3, 12, "explorer")
    last = AgentMention(32, 41, "reviewer")
    assert utf16_slice(command, 32, 41) == "@reviewer"
    stored = [
        last,
        good,
        AgentMention(1, 10, "explorer"),  # splits the surrogate pair
        AgentMention(4, 12, "explorer"),  # does not start at "@"
        AgentMention(3, 12, "reviewer"),  # names something else
        AgentMention(3, 11, "explore"),  # a prefix of the token
        AgentMention(21, 30, "reviewer"),  # user@reviewer is text
        AgentMention(3, 12, "explorer"),  # duplicate span
        AgentMention(30, 500, "x"),  # out of range
        AgentMention(-1, 3, "x"),
        AgentMention(5, 5, ""),
    ]
    assert valid_agent_mentions(command, stored) == (good, last)


@pytest.mark.spec("HOST-MENT-3")
def test_stored_skill_offsets_are_validated_the_same_way() -> None:
    command = "use /skill:pdf. x/skill:pdf"
    good = SkillMention(4, 14, "pdf")
    assert valid_skill_mentions(
        command, [good, SkillMention(17, 27, "pdf"), SkillMention(4, 13, "pd")]
    ) == (good,)


@pytest.mark.spec("HOST-MENT-3")
def test_stored_json_round_trips_and_missing_fields_read_back_unchanged() -> None:
    agents = (AgentMention(0, 9, "explorer"), AgentMention(10, 19, "réviewer"))
    skills = (SkillMention(3, 13, "pdf"),)
    agents_json = encode_agent_mentions(agents)
    skills_json = encode_skill_mentions(skills)
    assert agents_json == (
        '[{"start":0,"end":9,"name":"explorer"},{"start":10,"end":19,"name":"réviewer"}]'
    )
    assert skills_json == '[{"start":3,"end":13,"skillId":"pdf"}]'
    assert decode_agent_mentions(agents_json) == agents
    assert decode_skill_mentions(skills_json) == skills
    assert encode_agent_mentions(()) is None
    assert encode_skill_mentions(()) is None
    assert decode_agent_mentions(None) == ()
    assert decode_skill_mentions(None) == ()
    assert decode_agent_mentions('[{"start":true,"end":2,"name":"x"},7,{"start":0}]') == ()
    assert decode_agent_mentions("not json") == ()
    assert decode_skill_mentions('{"start":0}') == ()


# ---------------------------------------------------------------------------- properties

NAMES = ("explorer", "reviewer", "code", "code-reviewer", "ünïcödé", "\U0001d4b3-agent")
PROPERTY_CATALOG = tuple(Subagent(name) for name in NAMES)
CLOSERS = ("", ".", ",", ")", "!?", ":", "”", "\u2019.")
OPENERS = ("", "(", "[", '"', "“", "«")
# Alphabet: ASCII, Latin with combining marks, astral (surrogate pairs in UTF-16),
# emoji with modifiers and ZWJ, CJK, and the token characters themselves.
FILLER = st.lists(
    st.one_of(
        st.characters(codec="utf-8", exclude_categories=["Cs"]),
        st.sampled_from(
            ["@", "/", ":", " ", "\u0301", "😀", "👍🏽", "👩‍💻", "\U0001d4b3", "é", "漢", "\n"]
        ),
    ),
    max_size=12,
).map("".join)


@st.composite
def drafts(draw: st.DrawFn) -> tuple[str, list[int], list[int]]:
    """A draft with planted delegations (UTF-16 starts) and planted ``user@name`` starts."""
    parts: list[str] = []
    planted: list[int] = []
    embedded: list[int] = []
    for _ in range(draw(st.integers(0, 6))):
        parts.append(draw(FILLER))
        choice = draw(st.sampled_from(["mention", "email", "combining", "skill"]))
        name = draw(st.sampled_from(NAMES))
        if choice == "mention":
            prefix = " " + draw(st.sampled_from(OPENERS))
            position = utf16_length("".join(parts) + prefix)
            planted.append(position)
            parts.append(f"{prefix}@{name}{draw(st.sampled_from(CLOSERS))} ")
        elif choice == "email":
            prefix = " " + draw(st.sampled_from(["user", "é", "😀", "a\u0301", "漢"]))
            embedded.append(utf16_length("".join(parts) + prefix))
            parts.append(f"{prefix}@{name} ")
        elif choice == "combining":
            embedded.append(utf16_length("".join(parts) + " "))
            parts.append(f" @{name}\u0301 ")
        else:
            parts.append(f" /skill:{draw(st.sampled_from(['pdf', 'a.b', 'x-1']))} ")
    parts.append(draw(FILLER))
    return "".join(parts), planted, embedded


@pytest.mark.spec("HOST-MENT-1", "HOST-MENT-2", "HOST-MENT-3")
@given(drafts())
def test_offsets_always_point_at_the_at_token_in_utf16(
    case: tuple[str, list[int], list[int]],
) -> None:
    draft, planted, embedded = case
    if leading_command(draft) is not None:
        assert (
            resolve_mentions(
                draft,
                mode=ComposerMode.AGENT,
                subagents=PROPERTY_CATALOG,
                is_workspace_entry=no_files,
            )
            is None
        )
        return
    result = resolve_mentions(
        draft, mode=ComposerMode.AGENT, subagents=PROPERTY_CATALOG, is_workspace_entry=no_files
    )
    found = [] if result is None else list(result.agent_mentions)
    starts = {mention.start for mention in found}
    assert set(planted) <= starts
    assert not set(embedded) & starts
    for mention in found:
        assert utf16_slice(draft, mention.start, mention.end) == "@" + mention.name
        assert mention.name in NAMES
    if result is not None:
        assert result.command == draft
        assert result.prompt.endswith("\n\nUser request:\n" + draft)
        for skill in result.skill_mentions:
            assert utf16_slice(draft, skill.start, skill.end) == "/skill:" + skill.skill_id
        # What the resolver stores, the transcript validator accepts unchanged.
        assert valid_agent_mentions(draft, result.agent_mentions) == result.agent_mentions
        assert valid_skill_mentions(draft, result.skill_mentions) == result.skill_mentions
        assert decode_agent_mentions(encode_agent_mentions(result.agent_mentions)) == (
            result.agent_mentions
        )


@pytest.mark.spec("HOST-MENT-1")
@given(drafts(), st.sampled_from([ComposerMode.PLAN, ComposerMode.GOAL]))
def test_plan_and_goal_never_delegate(
    case: tuple[str, list[int], list[int]], mode: ComposerMode
) -> None:
    result = resolve_mentions(
        case[0], mode=mode, subagents=PROPERTY_CATALOG, is_workspace_entry=no_files
    )
    assert result is None or result.agent_mentions == ()


@pytest.mark.spec("HOST-MENT-1")
@given(drafts(), st.sets(st.sampled_from(NAMES)))
def test_shadowed_names_are_never_delegations(
    case: tuple[str, list[int], list[int]], shadowed: set[str]
) -> None:
    result = resolve_mentions(
        case[0],
        mode=ComposerMode.AGENT,
        subagents=PROPERTY_CATALOG,
        is_workspace_entry=shadowed.__contains__,
    )
    names = set() if result is None else {m.name for m in result.agent_mentions}
    assert not names & shadowed


@pytest.mark.spec("HOST-MENT-3")
@given(
    drafts(),
    st.lists(
        st.builds(
            AgentMention,
            st.integers(-2, 80),
            st.integers(-2, 80),
            st.sampled_from(NAMES),
        ),
        max_size=8,
    ),
)
def test_the_validator_keeps_only_spans_over_an_at_token(
    case: tuple[str, list[int], list[int]], stored: list[AgentMention]
) -> None:
    draft = case[0]
    for mention in valid_agent_mentions(draft, stored):
        assert utf16_slice(draft, mention.start, mention.end) == "@" + mention.name
