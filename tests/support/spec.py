"""The ``spec`` marker and a per-backend summary at the end of a run.

Every test that verifies a requirement names its ID: ``@pytest.mark.spec("STORE-2")``.
The terminal summary counts passed tests per store backend so a CI log shows that store
tests really ran on SQLite **and** Postgres.
"""

from __future__ import annotations

from collections import Counter

import pytest

BACKENDS = ("sqlite", "postgres")


def _backend_of(report: pytest.TestReport) -> str | None:
    for backend in BACKENDS:
        if f"[{backend}" in report.nodeid or f"-{backend}]" in report.nodeid:
            return backend
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many store-backed tests passed on each backend."""
    passed: Counter[str] = Counter()
    for report in terminalreporter.stats.get("passed", []):
        backend = _backend_of(report)
        if backend is not None and report.when == "call":
            passed[backend] += 1
    if passed:
        line = ", ".join(f"{backend}: {passed[backend]} passed" for backend in BACKENDS)
        terminalreporter.write_sep("=", f"store backends - {line}")
