"""The in-process backend forgets a fairness key's windows once they are empty, so
per-key windows of 100,000 distinct keys keep memory bounded."""

from __future__ import annotations

from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing import FakeClock


def test_per_key_windows_of_100000_keys_are_forgotten() -> None:
    clock = FakeClock()
    b = MemoryBackend(clock=clock)
    b.register(QueueConfig("q", per_key_rate_limit=["1/s", {"limit": 5, "period": 2,
                                                             "algorithm": "sliding"}]))
    for i in range(100_000):
        slot = b.try_admit(Ticket("q", f"t{i}", "i1", fairness_key=f"tenant-{i}")).slot  # type: ignore[union-attr]
        b.release(slot.slot_id)
    quota = b._queues["q"].quota  # noqa: SLF001 - the reference model's own state
    assert len(quota.keys) == 100_000
    clock.advance(2.5)
    b.reclaim()
    assert len(quota.keys) == 0 and len(quota.key_expiry) == 0
    assert b.try_admit(Ticket("q", "again", "i1", fairness_key="tenant-7")).admitted


def test_a_key_in_use_is_kept() -> None:
    clock = FakeClock()
    b = MemoryBackend(clock=clock)
    b.register(QueueConfig("q", per_key_rate_limit="1/10s"))
    assert b.try_admit(Ticket("q", "a", "i1", fairness_key="k")).admitted
    clock.advance(5)
    b.reclaim()
    assert not b.try_admit(Ticket("q", "b", "i1", fairness_key="k")).admitted
