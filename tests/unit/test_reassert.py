"""A worker instance re-asserts what it holds once the admission backend forgot it
(worker/reassert.py), on the in-process backend with a fake clock."""

from __future__ import annotations

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Admitted, Slot, Ticket
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
    assert reassert.reassert() == 0, "nothing forgotten, nothing restored"
    backend.unregister("q")  # the backend's state is gone
    assert reassert.reassert() == 2
    assert sorted(s.slot_id for s in backend.busy_slots("q")) == sorted(held)
    assert not backend.try_admit(Ticket("q", "c", "other")).admitted, "the cap holds at once"
    assert reassert.reassert() == 0, "once per loss"


def test_a_slot_whose_task_settled_during_the_call_is_released_again() -> None:
    backend, ledger, clock = world()
    gone = hold(backend, ledger, "a")
    kept = hold(backend, ledger, "m", manual=True)
    backend.unregister("q")

    class Racing:
        """The backend, with task "a" finishing (ledger popped, release landed before the
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
    assert reassert.reassert() == 1
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
    assert backend.busy_slots("q") == [], "stopped: the lease lapses"


def test_a_slot_the_backend_counts_but_no_task_here_holds_is_released_at_the_second_check() -> None:
    """A Redis failover to a replica that missed the last writes brings back slots whose
    releases were lost; their holder lives on. Every STALE_EVERY-th pass lists the busy slots:
    one held by this instance that its ledger does not know (no task here) is released once it
    was so at two checks in a row; a running task's slot, another instance's slot and a manual
    queue's slot are left alone."""
    from celery_flowcontrol.worker.reassert import STALE_EVERY

    manual = QueueConfig("m", concurrency=2, release="manual", max_hold=60)
    other = QueueConfig("o", concurrency=2)
    backend, ledger, clock = world()
    backend.register(manual)
    backend.register(other)
    running = hold(backend, ledger, "a")
    lost = backend.try_admit(Ticket("q", "b", "me"))  # its release was lost with the master
    theirs = backend.try_admit(Ticket("o", "c", "other"))  # another instance's
    kept = backend.try_admit(Ticket("m", "d", "me"))  # a manual slot outlives its task
    assert isinstance(lost, Admitted) and isinstance(kept, Admitted) and isinstance(theirs, Admitted)
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG, manual, other],
                          config_of=lambda name: None)
    for _ in range(STALE_EVERY):
        reassert.reassert()  # first check: "b" is stale once, not yet released
    assert len(backend.busy_slots("q")) == 2
    for _ in range(STALE_EVERY):
        reassert.reassert()  # second check: released
    assert [s.slot_id for s in backend.busy_slots("q")] == [running]
    assert [s.slot_id for s in backend.busy_slots("m")] == [kept.slot.slot_id]
    assert [s.slot_id for s in backend.busy_slots("o")] == [theirs.slot.slot_id]


def test_an_admission_not_yet_in_the_ledger_is_not_released() -> None:
    """A slot stale at one check only (its ledger entry came between two checks: an admission
    whose reply was on its way) is never released."""
    from celery_flowcontrol.worker.reassert import STALE_EVERY

    backend, ledger, clock = world()
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG],
                          config_of=lambda name: None)
    decision = backend.try_admit(Ticket("q", "a", "me"))
    assert isinstance(decision, Admitted)
    for _ in range(STALE_EVERY):
        reassert.reassert()
    ledger.add(("a", 1), Admission(entries=[Entry(decision.slot, False)]))
    for _ in range(2 * STALE_EVERY):
        reassert.reassert()
    assert [s.slot_id for s in backend.busy_slots("q")] == [decision.slot.slot_id]


def test_a_waiter_that_ran_here_since_it_joined_the_line_is_withdrawn() -> None:
    """A failover brings back a waiter (and a grant to it) for a task that has run here since:
    the stale check withdraws it, so its grant passes on at once instead of after grant_ttl;
    a waiter that joined the line after its ticket finished here (a new wait) stays."""
    from celery_flowcontrol.worker.reassert import STALE_EVERY

    backend, ledger, clock = world()
    ledger.clock = clock  # the backend's clock (Redis: its TIME, one clock for the fleet)
    first = hold(backend, ledger, "a")
    hold(backend, ledger, "b")
    ran = backend.try_admit(Ticket("q", "x", "me"))  # denied: x waits in line
    assert not ran.admitted
    clock.advance(1)
    # x ran here since (the writes that took it out of line were lost with the master).
    slot = Slot("q:lost", "q", "me", "x", "", "", clock(), None)
    ledger.add(("x", 1), Admission(entries=[Entry(slot, False)]))
    ledger.pop(("x", 1))
    assert not backend.try_admit(Ticket("q", "y", "me")).admitted  # y waits, never ran
    reassert = Reasserter(backend=backend, instance="me", ledger=ledger, configured=[CONFIG],
                          config_of=lambda name: None)
    for _ in range(STALE_EVERY):
        reassert.reassert()
    assert [w.task_id for w in backend.waiters("q")] == ["y"]
    backend.release(first)
    assert [g.task_id for g in backend.pending_grants("q")] == ["y"]
