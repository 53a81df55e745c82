"""Fixtures of the chaos scenarios: the e2e harness factory (reused as is) and a printout.

Every scenario prints one ``chaos <name>: ...`` line with what it counted (run with ``-s``
to see it live; pytest shows it for failures anyway).
"""

from __future__ import annotations

from tests.e2e.conftest import make_harness, pytest_runtest_makereport

__all__ = ["make_harness", "pytest_runtest_makereport"]
