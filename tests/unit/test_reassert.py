"""A worker instance re-asserts what it holds once the admission backend forgot it
(worker/reassert.py), on the in-process backend with a fake clock."""

from __future__ import annotations

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Admitted, Ticket
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing.support import FakeClock
from celery_flowcontrol.worker.ledger import Admission, Entry, Ledger
from celery_flowcontrol.worker.reassert import HeartbeatWatch, Reasserter, restore_queue

CONFIG = QueueConfig("q", concurrency=2)


def world() -> tuple[MemoryBackend, Ledger, FakeClock]:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    backend.register(CONFIG)
    return backend, Ledger(), clock


def hold(backend: MemoryBackend, ledger: Ledger, task: str, queue: str = "q",
         manual: bool = False) -> str:
    decision = backend.try_admit(Ticket(queue, task, "me"))
    assert isinstance(decision, Admitted)
    ledger.add((task, 1), Admission(entries=[Entry(decision.slot, manual)]))
    return decision.slot.slot_id


def test_a_lost_queue_is_recreated_with_the_running_tasks_counted() -> None:
    backend, ledger, clock = world()
    held = [hold(backend, ledger, t) for t in ("a", "b")]
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG],
                          config_of=lambda name: None)
    assert reassert() == 0, "nothing forgotten, nothing restored"
    backend.unregister("q")  # the backend's state is gone
    assert reassert() == 2
    assert sorted(s.slot_id for s in backend.busy_slots("q")) == sorted(held)
    assert not backend.try_admit(Ticket("q", "c", "other")).admitted, "the cap holds at once"
    assert reassert() == 0, "once per loss"


def test_a_slot_whose_task_settled_during_the_call_is_released_again() -> None:
    backend, ledger, clock = world()
    gone = hold(backend, ledger, "a")
    kept = hold(backend, ledger, "m", manual=True)
    backend.unregister("q")

    class Racing:
        """The backend, with task "a" settling (ledger popped, release landed before the
        restore) while the restore call is on its way."""

        def restore(self, *args: object) -> list[str]:
            ledger.pop(("a", 1))
            ledger.pop(("m", 1))  # a manual slot outlives its task: it stays
            assert backend.release(gone) is False
            return backend.restore(*args)  # type: ignore[arg-type]

        def release(self, slot_id: str) -> bool:
            return backend.release(slot_id)

    assert sorted(restore_queue(Racing(), "me", CONFIG, ledger)) == sorted([gone, kept])  # type: ignore[arg-type]
    assert [s.slot_id for s in backend.busy_slots("q")] == [kept]


def test_a_configured_queue_is_registered_again_even_when_nothing_is_held() -> None:
    backend, ledger, clock = world()
    other = QueueConfig("fg.0123abcd.2", concurrency=2)
    backend.register(other)
    slot = hold(backend, ledger, "g", queue="fg.0123abcd.2")
    backend.unregister("q")
    backend.unregister("fg.0123abcd.2")
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG],
                          config_of=lambda name: None)
    assert reassert() == 1
    assert backend.queues() == ["fg.0123abcd.2", "q"]
    assert [s.slot_id for s in backend.busy_slots("fg.0123abcd.2")] == [slot]


def test_the_watch_heartbeats_while_the_chores_are_silent() -> None:
    """The consumer's timer stops while it reconnects to the broker: the watch keeps the
    lease (and re-asserts), so running tasks keep their slots past instance_ttl."""
    import time

    backend = MemoryBackend(instance_ttl=0.3)
    backend.register(CONFIG)
    ledger = Ledger()
    slot = hold(backend, ledger, "a")
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG],
                          config_of=lambda name: None)
    watch = HeartbeatWatch(reassert, every=0.1)
    watch.start()
    try:
        time.sleep(1.0)  # over three instance_ttl with no chore at all
        backend.reclaim()
        assert [s.slot_id for s in backend.busy_slots("q")] == [slot]
    finally:
        watch.stop()
    time.sleep(0.5)
    backend.reclaim()
    assert backend.busy_slots("q") == [], "stopped: the lease lapses as before"
