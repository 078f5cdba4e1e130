"""Settings come from TUTTI_* variables, and every one is documented (OPS-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpcserver.settings import DEFAULT_PORTS, ServerSettings
from services.host.settings import Settings as HostSettings
from services.livestream.settings import Settings as LivestreamSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.mark.spec("OPS-1")
def test_every_setting_is_documented() -> None:
    text = DOCS.read_text()
    missing = [
        f"TUTTI_{name.upper()}"
        for name in ServerSettings.model_fields
        if f"`TUTTI_{name.upper()}`" not in text
    ]
    assert not missing


@pytest.mark.spec("OPS-1", "HOST-OBS-2")
def test_every_host_setting_is_documented() -> None:
    text = DOCS.read_text()
    missing = [
        f"TUTTI_{name.upper()}"
        for name in HostSettings.model_fields
        if f"`TUTTI_{name.upper()}`" not in text
    ]
    assert not missing


@pytest.mark.spec("OPS-1")
def test_every_livestream_setting_is_documented() -> None:
    text = DOCS.read_text()
    missing = [
        f"TUTTI_{name.upper()}"
        for name in LivestreamSettings.model_fields
        if f"`TUTTI_{name.upper()}`" not in text
    ]
    assert not missing


@pytest.mark.spec("OPS-1")
def test_settings_read_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTTI_GRACE_PERIOD_SECONDS", "7.5")
    monkeypatch.setenv("TUTTI_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("GRACE_PERIOD_SECONDS", "99")
    settings = HostSettings()
    assert settings.grace_period_seconds == 7.5
    assert settings.resolved_database_url() == "postgresql+psycopg://u@h/db"
    assert settings.listen_address == f"127.0.0.1:{DEFAULT_PORTS['host']}"


@pytest.mark.spec("OPS-1")
def test_default_store_is_sqlite_in_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TUTTI_DATABASE_URL", raising=False)
    monkeypatch.setenv("TUTTI_DATA_DIR", str(tmp_path))
    assert ServerSettings().resolved_database_url() == f"sqlite:///{tmp_path / 'tutti.db'}"


@pytest.mark.spec("OPS-1")
def test_invalid_setting_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTTI_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="log_format"):
        ServerSettings()


@pytest.mark.spec("OPS-1", "HOST-INT-6")
@pytest.mark.parametrize("value", ["0", "-1"])
def test_disposition_query_window_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TUTTI_INTERACTION_DISPOSITION_QUERY_SECONDS", value)
    with pytest.raises(ValueError, match="interaction_disposition_query_seconds"):
        HostSettings()
    monkeypatch.setenv("TUTTI_INTERACTION_DISPOSITION_QUERY_SECONDS", "0.5")
    assert HostSettings().interaction_disposition_query_seconds == 0.5
