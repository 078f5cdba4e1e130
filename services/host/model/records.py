"""Plain read models of the canonical entities, as the host repositories return them.

The repositories (``services.host.repository``) map rows to these dataclasses; domain modules
and the wire projections (``services.host.wire.projection``) only ever see them. Stored JSON
columns are parsed leniently here: a row written by an older build reads back with defaults
instead of failing a whole listing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from services.host.model.file_changes import FileChange

__all__ = [
    "AgentTargetRecord",
    "Capabilities",
    "InteractionOptionRecord",
    "InteractionRecord",
    "LaunchRef",
    "ModelOption",
    "SessionRecord",
    "SessionSettingsValue",
    "SettingsCatalog",
    "Subagent",
    "TombstoneRecord",
    "TurnRecord",
    "UsageRecord",
    "decode_subagent_catalog",
    "json_object",
    "subagents_from_json",
    "subagents_to_json",
]


def json_object(text: str | None) -> dict[str, Any]:
    """Parse a stored JSON object; anything else (null, garbage, a list) reads as ``{}``."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class SessionSettingsValue:
    """Typed Session settings (HOST-SES-6); ``None`` means unset."""

    model: str | None = None
    reasoning_effort: str | None = None
    permission_mode: str | None = None
    speed: int | None = None

    @classmethod
    def from_json(cls, text: str | None) -> SessionSettingsValue:
        """Read the stored ``settings_json``."""
        data = json_object(text)
        return cls(
            model=_opt_str(data.get("model")),
            reasoning_effort=_opt_str(data.get("reasoning_effort")),
            permission_mode=_opt_str(data.get("permission_mode")),
            speed=_opt_int(data.get("speed")),
        )

    def to_json(self) -> str:
        """Encode for ``settings_json`` (unset fields omitted, keys sorted)."""
        data = {
            "model": self.model,
            "reasoning_effort": self.reasoning_effort,
            "permission_mode": self.permission_mode,
            "speed": self.speed,
        }
        return json.dumps({k: v for k, v in data.items() if v is not None}, sort_keys=True)


@dataclass(frozen=True)
class Capabilities:
    """Delivery modes and features of a target's runtime (HOST-TGT-1)."""

    guidance: bool = False
    interrupt: bool = False
    live_settings: bool = False
    subagents: bool = False

    @classmethod
    def from_json(cls, text: str | None) -> Capabilities:
        """Read a stored ``capabilities_json``."""
        data = json_object(text)
        return cls(
            guidance=data.get("guidance") is True,
            interrupt=data.get("interrupt") is True,
            live_settings=data.get("live_settings") is True,
            subagents=data.get("subagents") is True,
        )

    def to_json(self) -> str:
        """Encode for a ``capabilities_json`` column."""
        return json.dumps(
            {
                "guidance": self.guidance,
                "interrupt": self.interrupt,
                "live_settings": self.live_settings,
                "subagents": self.subagents,
            },
            sort_keys=True,
        )


@dataclass(frozen=True)
class UsageRecord:
    """Accumulated provider usage."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    @classmethod
    def from_json(cls, text: str | None) -> UsageRecord:
        """Read a stored ``usage_json`` (null reads as zero usage)."""
        data = json_object(text)
        return cls(
            input_tokens=_opt_int(data.get("input_tokens")) or 0,
            output_tokens=_opt_int(data.get("output_tokens")) or 0,
            cached_input_tokens=_opt_int(data.get("cached_input_tokens")) or 0,
        )


@dataclass(frozen=True)
class TombstoneRecord:
    """Soft-delete state of a Session (HOST-DEL-3)."""

    deleted_at_unix_ms: int
    generation: str | None
    component_size: int | None
    legacy: bool


@dataclass(frozen=True)
class SessionRecord:
    """One ``sessions`` row, minus provider-private context (HOST-SES-3)."""

    workspace_id: str
    session_id: str
    parent_session_id: str | None
    root_session_id: str
    parent_turn_id: str | None
    agent_target_id: str | None
    provider: str
    title: str
    cwd: str | None
    rail_section_key: str
    rail_project_path: str | None
    settings: SessionSettingsValue
    capabilities: Capabilities
    usage: UsageRecord
    message_version: int
    pinned_at_unix_ms: int | None
    created_at_unix_ms: int
    updated_at_unix_ms: int
    active_turn_id: str | None
    tombstone: TombstoneRecord | None = None
    isolation: dict[str, Any] | None = None
    import_info: dict[str, Any] | None = None

    @property
    def is_live(self) -> bool:
        """Whether the Session is not tombstoned."""
        return self.tombstone is None


@dataclass(frozen=True)
class TurnRecord:
    """One ``turns`` row; enum-valued columns keep their stored strings."""

    workspace_id: str
    session_id: str
    turn_id: str
    client_submit_id: str | None
    phase: str
    outcome: str | None
    origin: str
    version: int
    created_at_unix_ms: int
    started_at_unix_ms: int | None = None
    settled_at_unix_ms: int | None = None
    result_message_id: str | None = None
    result_resolved_empty: bool = False
    root_turn_id: str | None = None
    failure_message: str | None = None
    retracted_at_unix_ms: int | None = None
    file_changes: tuple[FileChange, ...] = ()
    """The runtime-reported file-change snapshot (HOST-TURN-8); empty when none was reported."""


@dataclass(frozen=True)
class InteractionOptionRecord:
    """One choice an Interaction offers."""

    option_id: str
    label: str


@dataclass(frozen=True)
class InteractionRecord:
    """One ``interactions`` row, keyed by the full tuple (HOST-INT-1)."""

    workspace_id: str
    session_id: str
    turn_id: str
    request_id: str
    kind: str
    status: str
    tool_name: str | None
    input_json: str
    metadata_json: str
    title: str
    summary: str
    options: tuple[InteractionOptionRecord, ...] = ()
    answer: dict[str, Any] | None = None
    version: int = 1
    created_at_unix_ms: int = 0
    updated_at_unix_ms: int = 0
    occurred_at_unix_ms: int = 0


@dataclass(frozen=True)
class LaunchRef:
    """The launch reference Host derives the runtime target ref from (HOST-SES-1).

    Attributes:
        runtime_target_ref: Opaque ref sent to the runtime; required.
        options_json: A JSON object of launch options, kept verbatim ("" when none).
    """

    runtime_target_ref: str
    options_json: str = ""

    def to_json(self) -> str:
        """Encode for ``agent_targets.launch_ref_json``."""
        return json.dumps(
            {"runtime_target_ref": self.runtime_target_ref, "options_json": self.options_json},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> LaunchRef:
        """Read a stored launch ref; a malformed one reads as an empty ref (then rejected)."""
        try:
            data = json.loads(text or "")
        except ValueError:
            return cls("")
        if not isinstance(data, dict):
            return cls("")
        ref, options = data.get("runtime_target_ref"), data.get("options_json", "")
        return cls(
            ref if isinstance(ref, str) else "",
            options if isinstance(options, str) else "\x00",  # fails the shape check
        )


@dataclass(frozen=True)
class Subagent:
    """One entry of a subagent catalog (``@name``)."""

    name: str
    description: str = ""


@dataclass(frozen=True)
class ModelOption:
    """One model of a settings catalog."""

    model_id: str
    display_name: str = ""
    reasoning_efforts: tuple[str, ...] = ()
    default_reasoning_effort: str | None = None


@dataclass(frozen=True)
class SettingsCatalog:
    """The values Session settings are validated and normalized against (HOST-SES-6)."""

    models: tuple[ModelOption, ...] = ()
    default_model_id: str | None = None
    permission_modes: tuple[str, ...] = ()
    default_permission_mode: str | None = None
    speed_configurable: bool = False

    def model(self, model_id: str | None) -> ModelOption | None:
        """The catalog entry of ``model_id``, if any."""
        return next((m for m in self.models if m.model_id == model_id), None)

    def to_json(self) -> str:
        """Encode for ``agent_targets.settings_catalog_json``."""
        return json.dumps(
            {
                "models": [
                    {
                        "model_id": m.model_id,
                        "display_name": m.display_name,
                        "reasoning_efforts": list(m.reasoning_efforts),
                        "default_reasoning_effort": m.default_reasoning_effort,
                    }
                    for m in self.models
                ],
                "default_model_id": self.default_model_id,
                "permission_modes": list(self.permission_modes),
                "default_permission_mode": self.default_permission_mode,
                "speed_configurable": self.speed_configurable,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | None) -> SettingsCatalog:
        """Read a stored catalog; malformed parts read as empty."""
        try:
            data = json.loads(text or "{}")
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}

        def strings(value: object) -> tuple[str, ...]:
            return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

        def opt(value: object) -> str | None:
            return value if isinstance(value, str) else None

        models = tuple(
            ModelOption(
                model_id=str(m.get("model_id", "")),
                display_name=str(m.get("display_name", "")),
                reasoning_efforts=strings(m.get("reasoning_efforts")),
                default_reasoning_effort=opt(m.get("default_reasoning_effort")),
            )
            for m in data.get("models") or []
            if isinstance(m, dict)
        )
        return cls(
            models=models,
            default_model_id=opt(data.get("default_model_id")),
            permission_modes=strings(data.get("permission_modes")),
            default_permission_mode=opt(data.get("default_permission_mode")),
            speed_configurable=data.get("speed_configurable") is True,
        )


def subagents_to_json(subagents: tuple[Subagent, ...]) -> str:
    """Encode a subagent catalog (``subagent_catalog_json``, ``launch_subagents_json``)."""
    return json.dumps([{"name": s.name, "description": s.description} for s in subagents])


def decode_subagent_catalog(text: str | None) -> tuple[Subagent, ...] | None:
    """Read a stored subagent catalog exactly, or ``None`` when it cannot be read.

    Unlike :func:`subagents_from_json` nothing is dropped: a value that is not a JSON list
    of ``{"name": str, "description"?: str}`` objects is unreadable as a whole (the ``@``
    menu then shows no agents rather than part of the catalog, HOST-MENT-4). No stored
    catalog (null or empty: imports, older rows) is an empty one.
    """
    if not text:
        return ()
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, list):
        return None
    catalog: list[Subagent] = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        description = item.get("description", "")
        if not isinstance(description, str):
            return None
        catalog.append(Subagent(item["name"], description))
    return tuple(catalog)


def subagents_from_json(text: str | None) -> tuple[Subagent, ...]:
    """Read a stored subagent catalog; malformed entries are dropped."""
    try:
        data = json.loads(text or "[]")
    except ValueError:
        return ()
    if not isinstance(data, list):
        return ()
    return tuple(
        Subagent(str(item["name"]), str(item.get("description", "")))
        for item in data
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    )


@dataclass(frozen=True)
class AgentTargetRecord:
    """A registered agent target (HOST-TGT-1); also the input of registration."""

    agent_target_id: str
    provider: str
    launch_ref: LaunchRef
    display_name: str = ""
    enabled: bool = True
    capabilities: Capabilities = field(default_factory=Capabilities)
    subagents: tuple[Subagent, ...] = ()
    settings_catalog: SettingsCatalog = field(default_factory=SettingsCatalog)
    locality: str = "local"
    created_at_unix_ms: int = 0
    updated_at_unix_ms: int = 0
