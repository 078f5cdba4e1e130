"""Agent targets (HOST-TGT-1): deployment-wide records a Session launches on (ADR 0009).

A target names its provider (an open vocabulary, CON-6), a launch ref whose shape Host
validates and from which it derives the runtime target ref (HOST-SES-1), the runtime's
capabilities, the subagent catalog used by ``@agent`` mentions and the settings catalog
``UpdateSessionSettings`` validates against (HOST-SES-6).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from domainerrors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
)
from services.host.context import HostContext
from services.host.model.records import (
    AgentTargetRecord,
    LaunchRef,
    ModelOption,
    SettingsCatalog,
    Subagent,
)
from services.host.repository.unit_of_work import HostTransaction

__all__ = [
    "LOCALITIES",
    "AgentTargetRecord",
    "LaunchRef",
    "ModelOption",
    "SettingsCatalog",
    "Subagent",
    "launch_ref_problem",
    "list_targets",
    "register_target",
    "resolve_launchable",
    "set_target_enabled",
    "validate_target",
]

LOCALITIES = ("local", "shared", "remote")
"""Stored values of a target's locality."""

MAX_ID_LENGTH = 128
MAX_REF_LENGTH = 1024
MAX_TEXT_LENGTH = 1024
MAX_OPTIONS_JSON_BYTES = 64 * 1024
MAX_CATALOG_ENTRIES = 200
SUBAGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
"""What ``@name`` can name: the mention parser stops at anything else (HOST-MENT-1)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _text_problem(value: str, *, required: bool, limit: int) -> str | None:
    if required and not value.strip():
        return "is required"
    if len(value) > limit:
        return f"must be at most {limit} characters"
    if _CONTROL.search(value):
        return "must not contain control characters"
    return None


def launch_ref_problem(ref: LaunchRef) -> tuple[str, str] | None:
    """Return ``(field, problem)`` when the launch ref's shape is invalid, else ``None``."""
    problem = _text_problem(ref.runtime_target_ref, required=True, limit=MAX_REF_LENGTH)
    if problem is not None:
        return "runtime_target_ref", problem
    if ref.runtime_target_ref != ref.runtime_target_ref.strip():
        return "runtime_target_ref", "must not start or end with whitespace"
    if ref.options_json:
        if len(ref.options_json.encode("utf-8", "surrogatepass")) > MAX_OPTIONS_JSON_BYTES:
            return "options_json", f"must be at most {MAX_OPTIONS_JSON_BYTES} bytes"
        try:
            options = json.loads(ref.options_json)
        except ValueError:
            return "options_json", "must be a JSON object"
        if not isinstance(options, dict):
            return "options_json", "must be a JSON object"
    return None


def _unique_problem(values: list[str]) -> int | None:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            return index
        seen.add(value)
    return None


def _catalog_violations(catalog: SettingsCatalog, prefix: str) -> list[FieldViolation]:
    violations: list[FieldViolation] = []
    if len(catalog.models) > MAX_CATALOG_ENTRIES:
        violations.append(FieldViolation(f"{prefix}.models", "too many models"))
    for index, model in enumerate(catalog.models):
        where = f"{prefix}.models[{index}]"
        problem = _text_problem(model.model_id, required=True, limit=MAX_ID_LENGTH)
        if problem:
            violations.append(FieldViolation(f"{where}.model_id", problem))
        if (dup := _unique_problem(list(model.reasoning_efforts))) is not None:
            violations.append(FieldViolation(f"{where}.reasoning_efforts[{dup}]", "duplicate"))
        if any(not effort.strip() for effort in model.reasoning_efforts):
            violations.append(FieldViolation(f"{where}.reasoning_efforts", "empty value"))
        default = model.default_reasoning_effort
        if default is not None and default not in model.reasoning_efforts:
            violations.append(
                FieldViolation(f"{where}.default_reasoning_effort", "not in reasoning_efforts")
            )
    if (dup := _unique_problem([m.model_id for m in catalog.models])) is not None:
        violations.append(FieldViolation(f"{prefix}.models[{dup}].model_id", "duplicate model"))
    if catalog.default_model_id is not None and catalog.model(catalog.default_model_id) is None:
        violations.append(FieldViolation(f"{prefix}.default_model_id", "not one of the models"))
    if (dup := _unique_problem(list(catalog.permission_modes))) is not None:
        violations.append(FieldViolation(f"{prefix}.permission_modes[{dup}]", "duplicate"))
    if any(not mode.strip() for mode in catalog.permission_modes):
        violations.append(FieldViolation(f"{prefix}.permission_modes", "empty value"))
    if (
        catalog.default_permission_mode is not None
        and catalog.default_permission_mode not in catalog.permission_modes
    ):
        violations.append(
            FieldViolation(f"{prefix}.default_permission_mode", "not one of the permission_modes")
        )
    return violations


def validate_target(target: AgentTargetRecord, prefix: str = "target") -> None:
    """Check a target record's shape (SEC-2).

    Raises:
        InvalidArgument: with one field violation per problem; nothing is stored.
    """
    violations: list[FieldViolation] = []
    for name, value, limit in (
        ("agent_target_id", target.agent_target_id, MAX_ID_LENGTH),
        ("provider", target.provider, MAX_ID_LENGTH),
    ):
        problem = _text_problem(value, required=True, limit=limit)
        if problem is None and value != value.strip():
            problem = "must not start or end with whitespace"
        if problem:
            violations.append(FieldViolation(f"{prefix}.{name}", problem))
    problem = _text_problem(target.display_name, required=False, limit=MAX_TEXT_LENGTH)
    if problem:
        violations.append(FieldViolation(f"{prefix}.display_name", problem))
    launch = launch_ref_problem(target.launch_ref)
    if launch is not None:
        violations.append(FieldViolation(f"{prefix}.launch_ref.{launch[0]}", launch[1]))
    if target.locality not in LOCALITIES:
        violations.append(FieldViolation(f"{prefix}.locality", "unknown locality"))
    violations += _subagent_violations(target, prefix)
    violations += _catalog_violations(target.settings_catalog, f"{prefix}.settings_catalog")
    if violations:
        raise InvalidArgument("invalid agent target", field_violations=violations)


def _subagent_violations(target: AgentTargetRecord, prefix: str) -> list[FieldViolation]:
    """Problems of the target's subagent catalog: its size, each entry, duplicate names."""
    violations: list[FieldViolation] = []
    if len(target.subagents) > MAX_CATALOG_ENTRIES:
        violations.append(FieldViolation(f"{prefix}.subagents", "too many subagents"))
    for index, subagent in enumerate(target.subagents):
        if not SUBAGENT_NAME.fullmatch(subagent.name):
            violations.append(
                FieldViolation(
                    f"{prefix}.subagents[{index}].name",
                    "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
                )
            )
        problem = _text_problem(subagent.description, required=False, limit=MAX_TEXT_LENGTH)
        if problem:
            violations.append(FieldViolation(f"{prefix}.subagents[{index}].description", problem))
    if (dup := _unique_problem([s.name for s in target.subagents])) is not None:
        violations.append(FieldViolation(f"{prefix}.subagents[{dup}].name", "duplicate name"))
    return violations


async def register_target(
    ctx: HostContext, target: AgentTargetRecord
) -> tuple[AgentTargetRecord, bool]:
    """Create or replace a target (HOST-TGT-1); returns the stored record and ``created``.

    Replacing keeps ``created_at`` and affects only Sessions created afterwards (a Session
    copies what it needs at creation).

    Raises:
        InvalidArgument: the record's shape is invalid.
        AlreadyExists: reason ``PROVIDER_MISMATCH``; the target exists with another provider.
    """
    validate_target(target)
    now = ctx.clock()

    async def command(repos: HostTransaction) -> tuple[AgentTargetRecord, bool]:
        existing = await repos.targets.get(target.agent_target_id, for_update=True)
        if existing is None:
            stored = replace(target, created_at_unix_ms=now, updated_at_unix_ms=now)
            if await repos.targets.insert(stored):
                return stored, True
            existing = await repos.targets.get(target.agent_target_id, for_update=True)
            if existing is None:  # pragma: no cover - the conflicting row vanished again
                raise AlreadyExists("agent target registration raced; retry")
        if existing.provider != target.provider:
            raise AlreadyExists(
                f"agent target {target.agent_target_id!r} is registered for provider "
                f"{existing.provider!r}",
                reason="PROVIDER_MISMATCH",
                metadata={"agent_target_id": target.agent_target_id},
            )
        stored = replace(
            target, created_at_unix_ms=existing.created_at_unix_ms, updated_at_unix_ms=now
        )
        await repos.targets.update(stored)
        return stored, False

    return await ctx.transact(command)


async def list_targets(
    ctx: HostContext, *, include_disabled: bool, provider: str | None
) -> list[AgentTargetRecord]:
    """Targets ordered by id, optionally with the disabled ones and for one provider only."""

    async def query(repos: HostTransaction) -> list[AgentTargetRecord]:
        return await repos.targets.matching(include_disabled=include_disabled, provider=provider)

    return await ctx.transact(query, write=False)


async def set_target_enabled(
    ctx: HostContext, agent_target_id: str, enabled: bool
) -> AgentTargetRecord:
    """Enable or disable a target (HOST-TGT-1).

    Raises:
        InvalidArgument: ``agent_target_id`` is empty.
        NotFound: reason ``AGENT_TARGET_NOT_FOUND``.
    """
    if not agent_target_id:
        raise InvalidArgument.for_field("agent_target_id", "is required")
    now = ctx.clock()

    async def command(repos: HostTransaction) -> AgentTargetRecord:
        existing = await repos.targets.get(agent_target_id, for_update=True)
        if existing is None:
            raise target_not_found(agent_target_id)
        if existing.enabled == enabled:
            return existing
        stored = replace(existing, enabled=enabled, updated_at_unix_ms=now)
        await repos.targets.update(stored)
        return stored

    return await ctx.transact(command)


def target_not_found(agent_target_id: str) -> NotFound:
    """The typed error for an unknown target id."""
    return NotFound(
        f"no agent target {agent_target_id!r}",
        reason="AGENT_TARGET_NOT_FOUND",
        metadata={"agent_target_id": agent_target_id},
    )


def resolve_launchable(target: AgentTargetRecord | None, agent_target_id: str) -> AgentTargetRecord:
    """Check that a resolved target can launch a new Session (HOST-SES-1).

    Raises:
        FailedPrecondition: reason ``AGENT_TARGET_UNAVAILABLE`` for an unknown, disabled or
            malformed target (``metadata["cause"]`` says which).
    """
    cause: str | None = None
    if target is None:
        cause = "unknown"
    elif not target.enabled:
        cause = "disabled"
    elif launch_ref_problem(target.launch_ref) is not None:
        cause = "malformed_launch_ref"
    if target is None or cause is not None:
        raise FailedPrecondition(
            f"agent target {agent_target_id!r} is unavailable ({cause})",
            reason="AGENT_TARGET_UNAVAILABLE",
            metadata={"agent_target_id": agent_target_id, "cause": cause or ""},
        )
    return target
