"""Test support shipped with the package: the admission conformance kit and a fake clock.

``run_admission_backend_contract(make_backend)`` runs every check of the admission contract
against backends built by ``make_backend(clock)``; ours pass it, and a backend of your own
should too (see :mod:`celery_flowcontrol.testing.contract`).
"""

from __future__ import annotations

from .contract import CONTRACT_CHECKS, run_admission_backend_contract, run_check
from .support import FakeClock, admit, expect_admitted, expect_denied

__all__ = ["CONTRACT_CHECKS", "FakeClock", "admit", "expect_admitted", "expect_denied",
           "run_admission_backend_contract", "run_check"]
