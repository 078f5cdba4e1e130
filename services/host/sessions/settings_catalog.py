"""Validation and normalization of Session settings against a target's catalog (HOST-SES-6).

Pure logic, no I/O. A request's set fields are validated (an invalid one is a field
violation and nothing changes); the merged result is then normalized: catalog defaults fill
unset values, and a kept value that the new model no longer allows falls back to that
model's default instead of leaving an impossible combination stored.
"""

from __future__ import annotations

from collections.abc import Callable

from domainerrors import FieldViolation, InvalidArgument
from services.host.model.records import ModelOption, SessionSettingsValue, SettingsCatalog

__all__ = ["SPEED_RANGE", "merge_settings"]

SPEED_RANGE = (0, 100)
"""Inclusive bounds of ``SessionSettings.speed``."""


def merge_settings(
    catalog: SettingsCatalog,
    current: SessionSettingsValue,
    patch: SessionSettingsValue,
    *,
    field_prefix: str = "settings",
) -> SessionSettingsValue:
    """Apply ``patch`` (its set fields) to ``current`` and normalize against ``catalog``.

    Args:
        catalog: the target's settings catalog.
        current: the Session's stored settings (empty for a new Session).
        patch: the requested values; ``None`` fields keep their current value.
        field_prefix: request path of the settings message, for field violations.

    Returns:
        The normalized settings to store.

    Raises:
        InvalidArgument: a requested value is outside the catalog.
    """
    violations: list[FieldViolation] = []

    def bad(name: str, description: str) -> None:
        violations.append(FieldViolation(f"{field_prefix}.{name}", description))

    model_id = _merged_model_id(catalog, current, patch, bad)
    model = catalog.model(model_id)
    effort = _merged_effort(model, model_id, current, patch, bad)
    permission = _merged_permission(catalog, current, patch, bad)
    speed = _merged_speed(catalog, current, patch, bad)
    if violations:
        raise InvalidArgument("settings outside the target's catalog", field_violations=violations)
    return SessionSettingsValue(
        model=model_id if model is not None else None,
        reasoning_effort=effort,
        permission_mode=permission,
        speed=speed,
    )


_Report = Callable[[str, str], None]
"""Records a field violation: ``(field name, description)``."""


def _merged_model_id(
    catalog: SettingsCatalog,
    current: SessionSettingsValue,
    patch: SessionSettingsValue,
    bad: _Report,
) -> str | None:
    """The requested or kept model, or the catalog's default when the catalog lacks it."""
    if patch.model is not None and catalog.model(patch.model) is None:
        offered = ", ".join(m.model_id for m in catalog.models) or "none"
        bad("model", f"not a model of this target (offered: {offered})")
    model_id = patch.model if patch.model is not None else current.model
    if model_id is None or catalog.model(model_id) is None:
        model_id = catalog.default_model_id
    return model_id


def _merged_effort(
    model: ModelOption | None,
    model_id: str | None,
    current: SessionSettingsValue,
    patch: SessionSettingsValue,
    bad: _Report,
) -> str | None:
    """The requested or kept reasoning effort, or the model's default when it does not fit."""
    effort = current.reasoning_effort
    if patch.reasoning_effort is not None:
        allowed = model.reasoning_efforts if model is not None else ()
        if patch.reasoning_effort not in allowed:
            bad(
                "reasoning_effort",
                f"not a reasoning effort of model {model_id!r}"
                if allowed
                else "the selected model has no configurable reasoning effort",
            )
        effort = patch.reasoning_effort
    if model is None or effort not in model.reasoning_efforts:
        # Stored value no longer fits the (new) model: fall back to the model's default.
        effort = model.default_reasoning_effort if model is not None else None
    return effort


def _merged_permission(
    catalog: SettingsCatalog,
    current: SessionSettingsValue,
    patch: SessionSettingsValue,
    bad: _Report,
) -> str | None:
    """The requested or kept permission mode, or the catalog's default when it is not offered."""
    permission = current.permission_mode
    if patch.permission_mode is not None:
        if patch.permission_mode not in catalog.permission_modes:
            bad("permission_mode", "not a permission mode of this target")
        permission = patch.permission_mode
    if permission not in catalog.permission_modes:
        permission = catalog.default_permission_mode
    return permission


def _merged_speed(
    catalog: SettingsCatalog,
    current: SessionSettingsValue,
    patch: SessionSettingsValue,
    bad: _Report,
) -> int | None:
    """The requested or kept speed; None when the target does not accept one."""
    speed = current.speed
    if patch.speed is not None:
        low, high = SPEED_RANGE
        if not catalog.speed_configurable:
            bad("speed", "this target does not accept a speed")
        elif not low <= patch.speed <= high:
            bad("speed", f"must be within [{low}, {high}]")
        speed = patch.speed
    if not catalog.speed_configurable:
        speed = None
    return speed
