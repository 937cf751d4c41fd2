"""Fixtures for the operator tests against a real API server: see operator_support.py."""

from __future__ import annotations

import pytest

from tests.support.operator_session import (  # noqa: F401 (fixtures)
    MEASURED,
    admin,
    cluster,
    kubectl,
    operator_kubeconfig,
    operator_log,
    session_operator,
    webhook,
)


def pytest_configure(config: pytest.Config) -> None:
    # The local API server has a self-signed certificate; the kubeconfig says to trust it.
    config.addinivalue_line("filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("jitserve operator measurements")
        for key, value in sorted(MEASURED.items()):
            terminalreporter.write_line(f"{key}: {value:.3f}")
