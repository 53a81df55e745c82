"""The in-process backend keeps the whole admission contract (the kit users run too)."""

from __future__ import annotations

import pytest

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.testing import CONTRACT_CHECKS, FakeClock, run_admission_backend_contract
from celery_flowcontrol.testing.contract import Check, run_check


def make_backend(clock: FakeClock) -> MemoryBackend:
    return MemoryBackend(clock=clock)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
def test_memory_backend_check(check: Check) -> None:
    run_check(check, make_backend)


def test_run_admission_backend_contract_runs_every_check() -> None:
    assert len(run_admission_backend_contract(make_backend)) == len(CONTRACT_CHECKS)


def test_contract_fails_a_backend_that_breaks_it() -> None:
    """The kit can fail: a backend that ignores the cap is caught."""

    class Leaky(MemoryBackend):
        def try_admit(self, ticket):  # type: ignore[no-untyped-def]
            decision = super().try_admit(ticket)
            if decision.admitted:
                return decision
            self.withdraw(ticket.queue, ticket.task_id)
            self.set_capacity(ticket.queue, self.stats(ticket.queue).in_use + 1)
            return super().try_admit(ticket)

    with pytest.raises(AssertionError, match="check_concurrency_cap"):
        run_admission_backend_contract(lambda clock: Leaky(clock=clock))
