"""Lingering waiters (worker/linger.py) on real parts: the gate, the in-process backend and a SQLite
parking table; a fake consumer loop (hub and timer) runs what the real one would. A denied
message lingers, unacked and unparked, only while its queue's line moves, at most as many as
the window allows and at most for the linger bound; its grant resumes it straight into a slot.
A message whose ETA is near waits for it the same way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.common import QoS

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import CONCURRENCY, Admitted, Ticket
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Gate, Outcome
from celery_flowcontrol.worker.linger import Lingering
from tests.support.messages import TASK, Acks, make_gate, make_waker, message


class Loop:
    """The consumer's hub and timer, run by hand: ``call_soon`` and ``call_after`` queue."""

    def __init__(self) -> None:
        self.soon: list[tuple[Any, tuple[Any, ...]]] = []
        self.later: list[Entry] = []

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.soon.append((fn, args))

    def call_after(self, delay: float, fn: Any, args: tuple[Any, ...] = ()) -> Entry:
        entry = Entry(fn, args)
        entry.delay = delay
        self.later.append(entry)
        return entry

    def run_soon(self) -> None:
        while self.soon:
            fn, args = self.soon.pop(0)
            fn(*args)

    def fire_timers(self) -> None:
        for entry in [e for e in self.later if not e.cancelled]:
            entry.cancelled = True
            entry.fn(*entry.args)


class Entry:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args, self.cancelled, self.delay = fn, args, False, 0.0

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def world(store: ParkingStore) -> Iterator[tuple[Gate, MemoryBackend, Loop]]:
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    lingering = Lingering(0.5)
    loop = Loop()
    lingering.attach(loop, loop, limit=2)
    waker = make_waker(backend, store, lingering=lingering)  # as the worker builds it
    gate = make_gate(backend, store, lingering=lingering, waker=waker)
    backend.subscribe_grants(waker.on_grant)
    yield gate, backend, loop


def decide(gate: Gate, store: ParkingStore, outcomes: list[Outcome], resumable: bool = True) -> tuple[Any, Acks]:
    """Offer one message to the gate, as the strategy does: its resume decides it again."""
    m = message()
    acks = Acks(store, m.headers["id"])

    def resume() -> None:
        outcomes.append(gate.on_message(m, TASK, acks))

    outcomes.append(gate.on_message(m, TASK, acks, resume if resumable else None))
    return m, acks


def test_a_stalled_line_parks_at_once(world: tuple[Gate, MemoryBackend, Loop], store: ParkingStore) -> None:
    gate, backend, loop = world
    assert isinstance(backend.try_admit(Ticket("api", "elsewhere", "w2")), Admitted)  # another worker
    outcomes: list[Outcome] = []
    _, acks = decide(gate, store, outcomes)  # no grant seen, nothing admitted here: no movement
    assert outcomes == [Outcome.PARKED]
    assert acks.row_was_there == [True]


def test_an_admission_here_counts_as_movement(world: tuple[Gate, MemoryBackend, Loop], store: ParkingStore) -> None:
    gate, backend, loop = world
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)  # takes the slot: the line is active
    decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.LINGERING]


def test_a_lingering_waiter_is_resumed_by_its_grant_without_sql(world: tuple[Gate, MemoryBackend, Loop],
                                                           store: ParkingStore) -> None:  # fmt: skip
    gate, backend, loop = world
    handed: list[str] = []
    gate.lingering.ahead = SimpleNamespace(handed=handed.append)  # the wake-ahead policy
    outcomes: list[Outcome] = []
    first, _ = decide(gate, store, outcomes)
    second, acks = decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.LINGERING]
    assert acks.calls == 0 and store.count() == 0 and len(gate.lingering) == 1
    gate.releaser.finish(first.headers["id"], first.delivery_tag)  # release -> grant -> lingering waiter
    assert loop.soon and len(gate.lingering) == 0
    loop.run_soon()
    assert outcomes == [Outcome.RUN, Outcome.LINGERING, Outcome.RUN]
    assert handed == ["api"] and acks.calls == 0 and store.count() == 0
    loop.fire_timers()  # its linger bound was cancelled: nothing happens
    assert len(outcomes) == 3


def test_a_lingering_waiter_parks_when_its_linger_bound_passes(world: tuple[Gate, MemoryBackend, Loop],
                                                             store: ParkingStore) -> None:
    gate, backend, loop = world
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)
    _, acks = decide(gate, store, outcomes)
    loop.fire_timers()  # no grant within the linger bound: asked again, denied, parked, then acked
    assert outcomes == [Outcome.RUN, Outcome.LINGERING, Outcome.PARKED]
    assert acks.row_was_there == [True]
    # It kept its place in line: the next free slot is granted to it.
    assert [w.task_id for w in backend.waiters("api")] == [acks.task_id]


def test_lingering_is_bounded_by_the_window(world: tuple[Gate, MemoryBackend, Loop], store: ParkingStore) -> None:
    gate, backend, loop = world
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)
    for _ in range(3):
        decide(gate, store, outcomes)
    decide(gate, store, outcomes, resumable=False)  # a resumed message never lingers again
    assert outcomes == [Outcome.RUN, Outcome.LINGERING, Outcome.LINGERING, Outcome.PARKED, Outcome.PARKED]
    gate.lingering.detach()  # the consumer stopped: its unacked messages go back to the broker
    assert len(gate.lingering) == 0 and gate.lingering.room() == 0
    assert all(e.cancelled for e in loop.later)


def test_a_grant_for_a_waiter_lingering_elsewhere_is_not_resumed_here() -> None:
    loop = Loop()
    lingering = Lingering(0.5)
    lingering.attach(loop, loop, limit=4)
    lingering.moved("api")
    assert lingering.add("a", "api", lambda: None)
    assert not lingering.grant("b")
    assert lingering.grant("a") and not lingering.grant("a")
    assert Lingering(0.0).room() == 0 and not Lingering(0.5).add("x", "api", lambda: None)


def test_a_grant_that_comes_before_its_waiter_lingers_resumes_it_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The denial is made in the backend, then a release grants the waiter the freed slot
    while the denial's reply is still on its way to the loop: the grant finds nothing
    lingering. The message must not then wait out the linger bound with a slot kept for it
    (on real workers: a small tenant's task started half a second, some 15 places, late)."""
    loop = Loop()
    lingering = Lingering(0.5)
    lingering.attach(loop, loop, limit=4)
    lingering.moved("api")
    resumed: list[str] = []
    assert not lingering.grant("a")  # its denial's reply is not in yet
    assert lingering.add("a", "api", lambda: resumed.append("a"))
    loop.run_soon()
    assert resumed == ["a"] and len(lingering) == 0 and lingering.handed == 1
    loop.fire_timers()  # its linger bound was cancelled: it is not asked a second time
    assert resumed == ["a"]
    # A grant kept longer than the linger bound is not this delivery's.
    assert not lingering.grant("b")
    clock = time.monotonic() + 0.6
    monkeypatch.setattr(time, "monotonic", lambda: clock)
    lingering.moved("api")
    assert lingering.add("b", "api", lambda: resumed.append("b"))
    loop.run_soon()
    assert resumed == ["a"] and "b" in lingering


def test_a_higher_priority_takes_the_lingering_place_of_a_lower_one_of_its_queue() -> None:
    """Every place taken: a denial of a higher flow_priority (the head of the line) lingers in
    the place of the lowest one of its queue, which is asked again at once (and parks), so the
    next grant finds the head in memory, not behind a SQL wake and a second delivery."""
    loop = Loop()
    lingering = Lingering(0.5)
    lingering.attach(loop, loop, limit=2)
    for queue in ("api", "other"):
        lingering.moved(queue)
    resumed: list[str] = []
    assert lingering.add("low", "api", lambda: resumed.append("low"), priority=0)
    assert lingering.add("mid", "api", lambda: resumed.append("mid"), priority=3)
    assert not lingering.may(CONCURRENCY, None, "api", 0)  # no place, none below it
    assert not lingering.may(CONCURRENCY, None, "other", 9)  # none of its queue
    assert not lingering.add("same", "api", lambda: None, priority=0)
    assert lingering.may(CONCURRENCY, None, "api", 5)
    assert lingering.add("high", "api", lambda: resumed.append("high"), priority=5)
    assert "low" not in lingering and {"mid", "high"} <= set(lingering.lingering())
    loop.run_soon()
    assert resumed == ["low"]  # asked again now, not at its linger bound
    assert lingering.grant("high") and lingering.grant("mid")
    loop.run_soon()
    assert resumed == ["low", "high", "mid"]


def test_no_event_loop_no_lingering() -> None:
    lingering = Lingering(0.5)
    lingering.attach(None, Loop(), limit=8)
    lingering.moved("api")
    assert lingering.room() == 0 and not lingering.add("a", "api", lambda: None)


def test_admission_confirms_the_grant_of_a_lingering_waiter() -> None:
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    first = backend.try_admit(Ticket("api", "a", "w1"))
    assert isinstance(first, Admitted)
    assert not backend.try_admit(Ticket("api", "b", "w1")).admitted
    backend.release(first.slot.slot_id)
    assert isinstance(backend.try_admit(Ticket("api", "b", "w1")), Admitted)


def test_a_resume_queued_before_the_consumer_stopped_is_dropped() -> None:
    loop = Loop()
    lingering = Lingering(0.5)
    lingering.attach(loop, loop, limit=4)
    lingering.moved("api")
    resumed: list[str] = []
    assert lingering.add("a", "api", lambda: resumed.append("a"))
    assert lingering.grant("a")
    lingering.detach()  # a broker reconnect: the channel, and its unacked "a", are gone
    lingering.attach(loop, loop, limit=4)
    loop.run_soon()
    assert resumed == []  # its redelivery confirms the grant instead


def test_a_copy_woken_ahead_lingers_while_its_row_is_still_leased(
        world: tuple[Gate, MemoryBackend, Loop], store: ParkingStore) -> None:
    """The waker publishes a row, then deletes it: the copy can reach the gate in between. Its
    row is leased (being woken), so the copy lingers like any waiter, not deferred for half a
    second (CI: a small tenant's task ran 25 places late). A row that waits unleased is a
    redelivery of a parked message: never lingers (it would run, and its row wake later)."""
    gate, backend, loop = world
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)  # takes the only slot
    woken, acks = decide(gate, store, outcomes, resumable=False)  # parked
    assert outcomes == [Outcome.RUN, Outcome.PARKED] and acks.calls == 1
    (claimed,) = store.claim_many([acks.task_id])  # the waker's lease, before its publish
    # Its line moves (a wake ahead follows a hand-over): said here, not left to the admission
    # above, which a slow park and claim can put past the linger bound.
    gate.lingering.moved("api")
    outcomes.append(gate.on_message(woken, TASK, acks, lambda: None))
    assert outcomes[-1] is Outcome.LINGERING and acks.calls == 1
    gate.lingering.detach()
    gate.lingering.attach(loop, loop, limit=2)
    gate.lingering.moved("api")
    store.unclaim([claimed.task_id])  # the waker failed to publish: the row waits again
    outcomes.append(gate.on_message(woken, TASK, acks, lambda: None))
    assert outcomes[-1] is Outcome.PARKED and acks.calls == 2 and store.count() == 1


def rate_world(store: ParkingStore, rate: str) -> tuple[Gate, Loop]:
    """A gate on queue api with one GCRA *rate* and no cap, its lingering bound 0.5 s."""
    config = QueueConfig("api", rate_limit={"limit": int(rate.split("/")[0]), "period": 1,
                                            "algorithm": "gcra"})
    gate, loop, _, _ = ordered_world(store, config)
    return gate, loop


def test_a_rate_held_waiter_whose_turn_is_near_waits_for_it_unparked(store: ParkingStore) -> None:
    """A paced line has no grant to wait for: a rate denial whose turn comes within the linger
    bound lingers until that instant (whether or not the line was seen moving), then is asked
    again and runs; no SQL, no ack before it runs."""
    gate, loop = rate_world(store, "10/s")  # one every 0.1 s
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)
    _, acks = decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.LINGERING]
    assert store.count() == 0 and acks.calls == 0
    (timer,) = loop.later
    assert 0 < timer.delay <= 0.1
    time.sleep(timer.delay + 0.02)
    loop.fire_timers()
    assert outcomes == [Outcome.RUN, Outcome.LINGERING, Outcome.RUN] and store.count() == 0


def test_a_rate_held_waiter_whose_turn_is_far_parks(store: ParkingStore) -> None:
    gate, loop = rate_world(store, "1/s")  # the next in a second: past the 0.5 s bound
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)
    _, acks = decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.PARKED] and acks.row_was_there == [True]
    assert not loop.later


def test_a_near_eta_waits_for_it_unparked_and_a_far_one_parks(
        world: tuple[Gate, MemoryBackend, Loop], store: ParkingStore) -> None:
    """A message whose ETA is within the linger bound (a parked row woken ahead of its ETA, a
    short countdown) lingers until that instant, whether or not its line moves, and is asked
    then: it runs, with no SQL and no ack before it runs. One further off is parked."""
    gate, backend, loop = world
    outcomes: list[Outcome] = []
    near = message(eta=(datetime.now(timezone.utc) + timedelta(seconds=0.2)).isoformat())
    acks = Acks(store, near.headers["id"])
    outcomes.append(gate.on_message(near, TASK, acks,
                                    lambda: outcomes.append(gate.on_message(near, TASK, acks))))
    assert outcomes == [Outcome.LINGERING] and store.count() == 0 and acks.calls == 0
    (timer,) = loop.later
    assert 0.1 < timer.delay <= 0.2
    time.sleep(timer.delay)
    loop.fire_timers()
    assert outcomes == [Outcome.LINGERING, Outcome.RUN] and store.count() == 0
    far = message(eta=(datetime.now(timezone.utc) + timedelta(seconds=5)).isoformat())
    assert gate.on_message(far, TASK, Acks(store, far.headers["id"]), lambda: None) is Outcome.PARKED


def ordered_world(store: ParkingStore, config: QueueConfig) -> tuple[Gate, Loop, QoS, list[int]]:
    """A gate on *config* (cap 1) whose consumer's prefetch window is kombu's own QoS (4)."""
    backend = MemoryBackend()
    backend.register(config)
    lingering = Lingering(0.5)
    loop = Loop()
    applied: list[int] = []
    qos = QoS(lambda prefetch_count: applied.append(prefetch_count), 4)
    lingering.attach(loop, loop, limit=2, qos=qos)
    waker = make_waker(backend, store, lingering=lingering)
    gate = make_gate(backend, store, config, lingering=lingering, waker=waker)
    backend.subscribe_grants(waker.on_grant)
    return gate, loop, qos, applied


@pytest.mark.parametrize("config", [QueueConfig("api", concurrency=1, fairness="key"),
                                    QueueConfig("api", concurrency=1, order="lifo"),
                                    QueueConfig("api", concurrency=1, per_key_concurrency=1)],
                         ids=["fairness", "lifo", "per-key"])
def test_in_an_ordered_queue_a_lingering_waiter_raises_the_window(store: ParkingStore, config: QueueConfig) -> None:
    """The backlog must not wait in the broker behind lingering waiters: each one raises the
    consumer's prefetch window by one while it lingers (and gives it back when it resumes),
    and one denied when every lingering place is taken is parked at once (a drain)."""
    gate, loop, qos, applied = ordered_world(store, config)
    outcomes: list[Outcome] = []
    first, _ = decide(gate, store, outcomes)
    decide(gate, store, outcomes)
    decide(gate, store, outcomes)
    _, acks = decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.LINGERING, Outcome.LINGERING, Outcome.PARKED]
    assert qos.value == 6 and acks.row_was_there == [True]
    qos.update()
    assert applied == [6]  # what the consumer's loop sends the broker on its next turn
    # The grant goes to the rightful waiter (under lifo the parked newest one): whoever
    # resumes gives its window place back; the window stays 4 + those still lingering.
    gate.releaser.finish(first.headers["id"], first.delivery_tag)
    loop.run_soon()
    assert qos.value == 4 + len(gate.lingering)
    loop.fire_timers()  # the rest's bound passes: denied again, parked
    assert outcomes[-1] is Outcome.PARKED and qos.value == 4 and len(gate.lingering) == 0


def test_in_a_fifo_queue_lingering_waiters_take_window_places(store: ParkingStore) -> None:
    """One priority, no keys: the broker's order is the backend's, so the backlog stays in the
    broker (cheaply) while the window is full of waiters; until a flow_priority is seen."""
    gate, loop, qos, applied = ordered_world(store, QueueConfig("api", concurrency=1))
    outcomes: list[Outcome] = []
    decide(gate, store, outcomes)
    decide(gate, store, outcomes)
    assert outcomes == [Outcome.RUN, Outcome.LINGERING] and qos.value == 4
    m = message(flow_priority=3)  # a priority: from now on the queue's order is not the broker's
    acks = Acks(store, m.headers["id"])
    outcomes.append(gate.on_message(m, TASK, acks, lambda: outcomes.append(gate.on_message(m, TASK, acks))))
    assert outcomes[-1] is Outcome.LINGERING and qos.value == 5
    gate.lingering.detach()  # the consumer stopped: its QoS goes with it, nothing is given back
    loop.fire_timers()
    assert qos.value == 5 and len(gate.lingering) == 0
