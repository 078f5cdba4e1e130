"""Settings validation and normalization against a target catalog (HOST-SES-6)."""

from __future__ import annotations

import pytest

from domainerrors import InvalidArgument
from services.host.model.records import ModelOption, SessionSettingsValue, SettingsCatalog
from services.host.sessions.settings_catalog import merge_settings

CATALOG = SettingsCatalog(
    models=(
        ModelOption("fast", "Fast", ("low", "high"), "low"),
        ModelOption("deep", "Deep", ("high", "max"), "high"),
        ModelOption("plain", "Plain"),
    ),
    default_model_id="fast",
    permission_modes=("default", "accept_edits"),
    default_permission_mode="default",
    speed_configurable=True,
)


@pytest.mark.spec("HOST-SES-6")
def test_defaults_fill_unset_values() -> None:
    assert merge_settings(CATALOG, SessionSettingsValue(), SessionSettingsValue()) == (
        SessionSettingsValue(model="fast", reasoning_effort="low", permission_mode="default")
    )


@pytest.mark.spec("HOST-SES-6")
def test_unset_fields_keep_current_values_and_stale_ones_are_normalized() -> None:
    current = SessionSettingsValue("fast", "high", "accept_edits", 10)
    kept = merge_settings(CATALOG, current, SessionSettingsValue(speed=20))
    assert kept == SessionSettingsValue("fast", "high", "accept_edits", 20)
    # "high" is valid for deep too, so it is kept; "low" would fall back to deep's default.
    assert merge_settings(
        CATALOG, current, SessionSettingsValue(model="deep")
    ).reasoning_effort == ("high")
    low = SessionSettingsValue("fast", "low")
    assert merge_settings(CATALOG, low, SessionSettingsValue(model="deep")).reasoning_effort == (
        "high"
    )


@pytest.mark.spec("HOST-SES-6", "SEC-2")
def test_values_outside_the_catalog_are_field_violations() -> None:
    with pytest.raises(InvalidArgument) as caught:
        merge_settings(
            CATALOG,
            SessionSettingsValue(),
            SessionSettingsValue(
                model="plain", reasoning_effort="low", permission_mode="x", speed=500
            ),
        )
    assert {v.field for v in caught.value.field_violations} == {
        "settings.reasoning_effort",
        "settings.permission_mode",
        "settings.speed",
    }


@pytest.mark.spec("HOST-SES-6")
def test_an_empty_catalog_accepts_nothing_configurable() -> None:
    empty = SettingsCatalog()
    assert merge_settings(empty, SessionSettingsValue(), SessionSettingsValue()) == (
        SessionSettingsValue()
    )
    with pytest.raises(InvalidArgument) as caught:
        merge_settings(empty, SessionSettingsValue(), SessionSettingsValue(model="m", speed=1))
    assert {v.field for v in caught.value.field_violations} == {"settings.model", "settings.speed"}
