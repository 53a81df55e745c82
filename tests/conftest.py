"""The root of the tests: each test is marked after its folder, and the fixtures of
:mod:`tests.support.fixtures` are every tier's (the shared services, servers of a test's own,
the worker harness). tests/support/ holds everything tests share; no test module starts a
server, builds a message or a waker, or picks a free port by itself.

Tests are marked by folder: tests/unit -> `unit`, tests/contract -> `contract`, and so on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.services import in_ci, postgres_url_setting, rabbitmq_url_setting, redis_url_setting

pytest_plugins = ("tests.support.fixtures",)

TEST_FOLDERS = ("unit", "contract", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test after its folder, so `-m unit` or `-m "not e2e"` select by kind."""
    tests_root = Path(__file__).parent
    for item in items:
        try:
            folder = item.path.relative_to(tests_root).parts[0]
        except ValueError:
            continue
        if folder in TEST_FOLDERS:
            item.add_marker(getattr(pytest.mark, folder))


def pytest_report_header(config: pytest.Config) -> str:
    """Say where the services are expected, and whether a missing one fails or skips."""
    mode = "fail" if in_ci() else "skip"
    return (
        f"flowcontrol services: redis={redis_url_setting()} postgres={postgres_url_setting()} "
        f"rabbitmq={rabbitmq_url_setting()}; unreachable -> {mode}"
    )
