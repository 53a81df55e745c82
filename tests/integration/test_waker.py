"""The waker's hand-over on real parts (a SQLite parking table, the in-process backend): a grant
is woken by the instance that parked its waiter, and grants that queue up are woken together;
a row this worker knows is woken when it is due, without a poll (waking.py), except during an
outage."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Admitted, Grant, Ticket
from celery_flowcontrol.admission.redis.grants import decode_grant
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import BackendUnavailableError
from celery_flowcontrol.parking import ParkedMessage, ParkingStore
from celery_flowcontrol.worker.wake_items import Ahead, Committed, Granted
from celery_flowcontrol.worker.waker import Waker
from celery_flowcontrol.worker.waking import LEAD, lead_for
from tests.support.messages import make_waker


class Broker:
    """An app whose producer records what the waker publishes."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.at: dict[str, float] = {}  # task id -> when it was last published
        connection = SimpleNamespace(transport=SimpleNamespace(driver_type="redis"), connection_errors=(OSError,),
                                     channel_errors=())
        producer = SimpleNamespace(connection=connection, channel=SimpleNamespace(),
                                   publish=lambda body, headers, **_: self._heard(headers["id"]))

        @contextmanager
        def acquire(block: bool = True) -> Iterator[Any]:
            yield producer

        self.producer_pool = SimpleNamespace(acquire=acquire)

    def _heard(self, task_id: str) -> None:
        self.published.append(task_id)
        self.at[task_id] = time.time()


def parked(task_id: str) -> ParkedMessage:
    return ParkedMessage(task_id=task_id, queue="api", body=b"[]", wake_at=time.time() + 60, task_name="proj.t",
                         headers={"id": task_id}, routing_key="celery")  # fmt: skip


def broker_waker(store: ParkingStore, instance: str = "w1") -> tuple[Waker, Broker]:
    broker = Broker()
    return make_waker(MemoryBackend(), store, app=broker, instance=instance), broker


def test_a_grant_names_the_instance_of_its_waiter() -> None:
    heard: list[Grant] = []
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    backend.subscribe_grants(heard.append)
    first = backend.try_admit(Ticket("api", "a", "w1"))
    assert isinstance(first, Admitted)
    backend.try_admit(Ticket("api", "b", "w1"))
    backend.try_admit(Ticket("api", "b", "w2"))  # a re-check from another worker: it parked it last
    backend.release(first.slot.slot_id)
    assert [(g.task_id, g.instance) for g in heard] == [("b", "w2")]
    # A hint, not part of the grant's identity: the pending grant compares equal.
    assert backend.pending_grants("api") == heard


def test_announcements_decode_with_or_without_the_instance() -> None:
    assert decode_grant('["api","b","api:1","1.5","121.5","w2"]').instance == "w2"
    assert decode_grant('["api","b","api:1","1.5","121.5"]') == Grant("api", "b", "api:1", 1.5, 121.5)


def test_only_the_named_instance_queues_a_grant_for_waking(store: ParkingStore) -> None:
    waker, _ = broker_waker(store, "w1")
    waker.on_grant(Grant("api", "x", "api:1", 0.0, 1.0, "w2"))
    assert waker.inbox.empty()
    waker.on_grant(Grant("api", "y", "api:2", 0.0, 1.0, "w1"))
    waker.on_grant(Grant("api", "z", "api:3", 0.0, 1.0))  # nobody named: every worker tries
    assert [waker.inbox.get_nowait() for _ in range(2)] == [
        Granted(Grant("api", "y", "api:2", 0.0, 1.0, "w1")), Granted(Grant("api", "z", "api:3", 0.0, 1.0))]


def test_grants_queued_together_are_woken_in_one_round(store: ParkingStore) -> None:
    for task_id in ("a", "b", "c"):
        assert store.park(parked(task_id))
    store.claim("c")  # another waker is republishing it
    waker, broker = broker_waker(store)
    assert waker.wake_many(["a", "b", "c", "d"], remember=True) == 2
    assert sorted(broker.published) == ["a", "b"]
    assert store.get("a") is None and store.get("b") is None and store.get("c") is not None
    # "d" is not parked yet: its park wakes it (and "c" stays with the waker that holds it).
    assert store.park(parked("d"))
    waker.parked("d")
    assert waker.inbox.get_nowait() == Committed("d")


def test_a_park_that_commits_while_a_grant_is_claimed_never_waits_for_that_claim(
        store: ParkingStore, sqlite_url: str) -> None:
    """The consumer's loop tells the waker of each row it parks; a grant's claim may be held up
    by the database meanwhile (another node's transaction on the file). The loop does not wait
    for that claim, and the row is still woken: the claim may have missed it, so it is claimed
    once more."""
    store.count()  # the tables exist
    waker, _ = broker_waker(store)
    blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the claim waits for the file's write lock
    claim = threading.Thread(target=waker.wake_many, args=(["d"], True))
    claim.start()
    try:
        time.sleep(0.2)
        assert claim.is_alive()
        began = time.monotonic()
        waker.parked("d")
        assert time.monotonic() - began < 0.1, "the loop is never held by a claim"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
        claim.join(10)
    assert waker.inbox.get_nowait() == Committed("d"), "claimed once more"
    assert waker.inbox.empty()


def test_a_row_this_worker_parked_is_woken_when_due_without_a_poll(store: ParkingStore) -> None:
    """No tick of the consumer's timer ever comes here: the waker sleeps until the rows it
    parked are due (claimed by id LEAD before, rows due together in one claim). A row only
    another worker parked waits for the poll (a tick), as before, and so does one waiting for
    a slot (its grant wakes it); one of ours parked again meanwhile until later (woken by its
    grant, denied elsewhere) waits for then."""
    waker, broker = broker_waker(store)
    assert store.count() == 0  # the database set up before the clock starts
    now = time.time()
    due = {"a": now + 0.3, "b": now + 0.31, "c": now + 0.6, "moved": now + 0.3}
    for task_id, wake_at in due.items():
        row = replace(parked(task_id), wake_at=wake_at, reason="rate")
        assert store.park(row)
        waker.parked(row)
    assert store.park(replace(parked("theirs"), wake_at=now + 0.8))  # parked by another worker
    slot = replace(parked("slot"), wake_at=now + 0.3)  # waits for a grant: its retry is the poll's
    assert store.park(slot)
    waker.parked(slot)
    assert store.reschedule("moved", now + 0.9)
    due["moved"] = now + 0.9
    waker.start()
    try:
        wait_until(lambda: len(broker.at) >= 4)
        assert sorted(broker.at) == ["a", "b", "c", "moved"]
        mine = ("a", "b", "c", "moved")
        assert all(broker.at[t] >= due[t] - LEAD for t in mine), "never before its lead"
        assert all(broker.at[t] < due[t] + 0.5 for t in mine), "on time, not a poll late"
        assert store.get("c") is None
        time.sleep(max(0.0, now + 1.2 - time.time()))
        assert "theirs" not in broker.at and store.get("theirs") is not None
        assert "slot" not in broker.at and store.get("slot") is not None
        waker.tick()
        wait_until(lambda: "theirs" in broker.at and "slot" in broker.at)
    finally:
        waker.stop()


def test_a_row_claimed_and_given_back_is_woken_when_due(store: ParkingStore) -> None:
    """A rate-held row the wake-ahead claims and gives back is known here from then on."""
    from celery_flowcontrol.worker.linger import Lingering

    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    assert isinstance(backend.try_admit(Ticket("api", "busy", "w1")), Admitted)
    backend.try_admit(Ticket("api", "r1", "w1"))
    turn = time.time() + 0.4
    store.park(replace(parked("r1"), reason="rate", wake_at=turn))  # parked by another worker
    broker = Broker()
    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=4)
    waker = make_waker(backend, store, app=broker, lingering=lingering)
    assert waker.wake_ahead("api") == 0 and broker.published == []
    waker.start()
    try:
        wait_until(lambda: "r1" in broker.at)
        assert turn - LEAD <= broker.at["r1"] < turn + 0.5
    finally:
        waker.stop()


def test_an_eta_row_is_claimed_within_the_gates_eta_slack_even_where_copies_may_linger() -> None:
    """Its copy comes within the gate's ETA_SLACK of its ETA and goes to Celery, which holds it
    until then: claimed further ahead to linger, a burst of countdowns would find lingering's
    few places full and bounce between the table and the broker (waking.py)."""
    from celery_flowcontrol.worker.asking import ETA_SLACK
    from celery_flowcontrol.worker.linger import Lingering

    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=4)
    assert lead_for("eta", lingering) == lead_for("eta", None) == LEAD < ETA_SLACK
    assert lead_for("rate", lingering) == LEAD


class Outage(MemoryBackend):
    """The in-process backend, unreachable while ``down`` is set."""

    down = False

    def heartbeat(self, instance: str, queues: Collection[str] | None = None) -> None:
        if self.down:
            raise BackendUnavailableError("down")
        super().heartbeat(instance, queues)


def test_due_rows_wait_for_the_poll_during_an_outage(store: ParkingStore) -> None:
    """Woken while admission is unreachable, a row would only wait unacked in a worker: the
    timer rests until a poll's chores go through again, and that poll wakes what is due."""
    broker = Broker()
    backend = Outage()
    waker = make_waker(backend, store, app=broker, heartbeat_every=0)
    backend.down = True
    waker.start()
    try:
        waker.tick()  # the heartbeat fails: an outage
        wait_until(lambda: waker._outage)
        row = replace(parked("a"), wake_at=time.time() + 0.3, reason="eta")
        assert store.park(row)
        waker.parked(row)
        time.sleep(0.8)
        assert broker.published == [] and store.get("a") is not None
        backend.down = False
        waker.tick()
        wait_until(lambda: broker.published == ["a"])
    finally:
        waker.stop()


def wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "not within 10 s"
        time.sleep(0.01)


def test_claim_many_leases_each_row_once(store: ParkingStore) -> None:
    for task_id in ("a", "b"):
        store.park(parked(task_id))
    assert [m.task_id for m in store.claim_many(["b", "a", "a", "gone"])] == ["a", "b"]
    assert store.claim_many(["a", "b"]) == []
    assert store.claim_many([]) == []


def test_waiters_are_woken_ahead_in_the_line_order_not_the_table_order(store: ParkingStore) -> None:
    from celery_flowcontrol.worker.linger import Lingering

    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    assert isinstance(backend.try_admit(Ticket("api", "busy", "w1")), Admitted)
    for task_id in ("a", "b", "c", "d"):
        backend.try_admit(Ticket("api", task_id, "w1"))
    for task_id in ("d", "c", "b"):  # "a" lingers somewhere; the table's order is not the line's
        store.park(parked(task_id))
    broker = Broker()
    waker = make_waker(backend, store, app=broker)
    assert waker.wake_ahead("api") == 0  # nowhere for them to linger
    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=2)
    waker.lingering = lingering
    assert waker.wake_ahead("api") == 2
    assert broker.published == ["b", "c"]
    assert waker.wake_ahead("api") == 0  # both on their way back: no room until they linger
    assert store.get("d") is not None and store.get("d").claimed_until is None  # not leased
    assert waker.wake_ahead("nope") == 0


def test_only_waiters_parked_for_a_slot_are_woken_ahead(store: ParkingStore) -> None:
    """A waiter a rate limit holds comes back at its turn: woken ahead of it, it would only be
    denied and parked again (SQL and broker in front of every fresh message). The next
    waiters in line that were parked for rate are left parked, unleased; one parked for a
    slot is woken; and a queue whose next rows are all rate-held is not tried again at once."""
    from celery_flowcontrol.worker.linger import Lingering

    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    assert isinstance(backend.try_admit(Ticket("api", "busy", "w1")), Admitted)
    for task_id in ("r1", "r2", "c1"):
        backend.try_admit(Ticket("api", task_id, "w1"))
    store.park(replace(parked("r1"), reason="rate"))
    store.park(replace(parked("r2"), reason="rate"))
    store.park(parked("c1"))  # reason "concurrency"
    broker = Broker()
    waker = make_waker(backend, store, app=broker)
    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=4)
    waker.lingering = lingering
    assert waker.wake_ahead("api") == 1
    assert broker.published == ["c1"]
    for task_id in ("r1", "r2"):
        row = store.get(task_id)
        assert row is not None and row.claimed_until is None, "left parked, not leased"
    assert waker.wake_ahead("api") == 0
    waker.ahead.handed("api")
    assert waker.inbox.empty(), "all rate-held a moment ago: no prewake queued"


def test_a_queue_found_with_no_parked_row_is_not_counted_again_for_a_moment(
        store: ParkingStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a busy line whose waiters all linger, each hand-over asks to wake ahead: a queue
    counted empty skips the waker's turn (and its SQL count) for EMPTY_RECHECK, until this
    worker parks a row or the moment passes."""
    from celery_flowcontrol.worker import wake_ahead as wake_ahead_module
    from celery_flowcontrol.worker.linger import Lingering

    waker, _ = broker_waker(store)
    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=2)
    waker.lingering = lingering
    counts: list[str] = []
    count = store.count
    monkeypatch.setattr(store, "count", lambda queue=None: counts.append(queue) or count(queue))
    waker.ahead.handed("api")
    assert waker.inbox.get_nowait() == Ahead("api")  # never counted: it asks
    assert waker.wake_ahead("api", 1) == 0 and counts == ["api"]
    waker.ahead.handed("api")
    waker.ahead.handed("api")
    assert waker.inbox.empty()  # counted empty a moment ago: no turn, no count
    waker.ahead.handed("other")
    assert not waker.inbox.empty()  # per queue
    waker.inbox.get_nowait()
    # A row parked here: asked again at once, and found.
    assert store.park(parked("a"))
    waker.parked("a")
    waker.ahead.handed("api")
    assert waker.inbox.get_nowait() == Ahead("api")
    waker.wake_ahead("api", 1)  # (no line to wake it from: this backend has no such queue)
    assert counts == ["api", "api"] and "api" not in waker.ahead._empty
    waker.ahead.handed("api")
    assert waker.inbox.get_nowait() == Ahead("api")  # a row is there: every hand-over asks
    # Empty again; a row parked by another worker is looked for once the moment has passed.
    store.done(["a"])
    assert waker.wake_ahead("api", 1) == 0 and counts == ["api", "api", "api"]
    waker.ahead.handed("api")
    assert waker.inbox.empty()
    monkeypatch.setattr(wake_ahead_module, "EMPTY_RECHECK", 0.0)
    waker.ahead.handed("api")
    assert waker.inbox.get_nowait() == Ahead("api")


def test_wake_ahead_keeps_no_state_for_queues_that_come_and_go(
        store: ParkingStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flow_group has a queue of its own; a worker that served a million groups must not
    keep a million entries: queues with nothing woken ahead leave no entry, and the empty
    marks are pruned once they are stale."""
    from celery_flowcontrol.worker import wake_ahead as wake_ahead_module
    from celery_flowcontrol.worker.linger import Lingering

    waker, _ = broker_waker(store)
    lingering = Lingering(0.5)
    lingering.attach(SimpleNamespace(), SimpleNamespace(), limit=2)
    waker.lingering = lingering
    monkeypatch.setattr(wake_ahead_module, "EMPTY_RECHECK", 0.0)
    for i in range(500):
        assert waker.wake_ahead(f"fg.{i}", 1) == 0
    assert waker.ahead._ahead == {} and len(waker.ahead._empty) <= 64
