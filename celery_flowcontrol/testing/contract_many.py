"""Conformance checks of ``try_admit_many``: the decisions of one call for many tickets are
those of ``try_admit`` for each, in order (a backend may send them in one round trip)."""

from __future__ import annotations

from collections.abc import Callable

from ..admission.base import AdmissionBackend, Admitted, Decision, Denied, Refused, Ticket
from ..config import QueueConfig
from .support import FakeClock


def _shape(d: Decision) -> tuple[object, ...]:
    """What must agree between the two ways of asking (slot ids are each queue's own)."""
    if isinstance(d, Admitted):
        return ("admitted", d.slot.task_id, d.slot.holder)
    if isinstance(d, Denied):
        return ("denied", d.reason, d.retry_at)
    assert isinstance(d, Refused)
    return ("refused", d.key, d.bound)


def check_admit_many_as_one_by_one(b: AdmissionBackend, clock: FakeClock) -> None:
    """try_admit_many decides as try_admit for each ticket in order: admissions, denials with
    their reason and instant, refusals at a waiting bound, a ticket asked twice in one call."""
    for name in ("one", "many"):
        b.register(QueueConfig(name, concurrency=2, fairness="key", per_key_concurrency=1,
                               max_waiting=6, rate_limit="20/s"))
    calls = [(f"t{i}", f"k{i % 3}", i % 2) for i in range(10)] + [("t4", "k1", 0)]

    def tickets(queue: str) -> list[Ticket]:
        return [Ticket(queue, tid, "i1", prio, key) for tid, key, prio in calls]

    one = [b.try_admit(t) for t in tickets("one")]
    many = b.try_admit_many(tickets("many"))
    assert [_shape(d) for d in many] == [_shape(d) for d in one], (many, one)
    assert [w.task_id for w in b.waiters("many")] == [w.task_id for w in b.waiters("one")]
    assert b.try_admit_many([]) == []


MANY_CHECKS: list[Callable[[AdmissionBackend, FakeClock], None]] = [check_admit_many_as_one_by_one]
