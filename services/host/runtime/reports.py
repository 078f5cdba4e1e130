"""Domain form of a runtime report (HOST-RT-1): what the wire layer decodes into.

Enum-valued fields hold the canonical lowercase strings (``running``, ``pending`` ...);
``None`` stands for a value the wire could not map (unspecified or unknown), which the
report application rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.host.model.file_changes import FileChange
from services.host.turns.interactions import DispositionInput, TransitionInput
from services.host.turns.tool_payload import ToolCallSnapshot


@dataclass(frozen=True)
class SessionPatchItem:
    """Updates (or, with ``parent_session_id``, creates) the report's Session."""

    agent_target_id: str | None = None
    parent_session_id: str | None = None
    parent_turn_id: str | None = None
    title: str | None = None
    cwd: str | None = None
    usage_json: str | None = None
    provider_session_ref: str | None = None
    runtime_context_json: str | None = None


@dataclass(frozen=True)
class TurnPatchItem:
    """A Turn state patch."""

    turn_id: str
    phase: str | None
    outcome: str | None = None
    origin: str | None = None
    root_turn_id: str | None = None
    failure_message: str | None = None
    result_anchor_message_id: str | None = None
    occurred_at_unix_ms: int = 0
    file_changes: tuple[FileChange, ...] | None = None
    """The reported file-change snapshot (HOST-TURN-8); ``None`` leaves the stored one."""

    @property
    def terminal(self) -> bool:
        """Whether this patch settles the Turn."""
        return self.phase == "settled"


@dataclass(frozen=True)
class MessageSnapshotItem:
    """A message snapshot; tool-call snapshots carry ``tool_call`` for projection.

    ``user_visible_assistant_response`` is the runtime's classification (HOST-MSG-1);
    ``None`` means the snapshot left it unset, which the report application rejects.
    """

    message_id: str
    turn_id: str | None
    role: str | None
    kind: str | None
    occurred_at_unix_ms: int
    payload_json: str | None = None
    tool_call: ToolCallSnapshot | None = None
    user_visible_assistant_response: bool | None = None


@dataclass(frozen=True)
class SessionLostItem:
    """The provider session is confirmed dead."""

    reason: str


ReportItem = (
    SessionPatchItem
    | TurnPatchItem
    | TransitionInput
    | MessageSnapshotItem
    | DispositionInput
    | SessionLostItem
)


@dataclass(frozen=True)
class InvalidField:
    """One invalid value of a report: the item it is in, its field path and the problem."""

    index: int
    field: str
    description: str


@dataclass(frozen=True)
class RuntimeReportInput:
    """One atomic report for one Session, items in provider order."""

    report_id: str
    workspace_id: str
    session_id: str
    items: tuple[ReportItem | None, ...] = field(default_factory=tuple)
    """``None`` marks an item with no payload set (rejected)."""
    invalid_fields: tuple[InvalidField, ...] = ()
    """Values the wire found invalid (an unknown enum number, a NUL character): the report
    is rejected before anything is read or written (SEC-2)."""


@dataclass(frozen=True)
class ItemResult:
    """The outcome of one item."""

    index: int
    outcome: str
    stale: bool = False
    message: str | None = None


@dataclass(frozen=True)
class ReportVerdict:
    """Host's verdict on a report.

    The outcome is ``applied``, ``already_applied``, ``conflict`` or ``rejected`` (the last two
    commit nothing).
    """

    report_id: str
    outcome: str
    item_results: tuple[ItemResult, ...]
    reason: str | None = None
