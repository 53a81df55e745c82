"""The worker's gate on real parts: a real parking database, real admission backends, real
kombu messages; only the consumer loop around it is absent. Each bad or unlucky input has a
stated outcome, and no message is acked before its row is committed."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Outcome
from tests.support.messages import TASK, Acks, make_gate, message


@pytest.fixture
def backend() -> MemoryBackend:
    b = MemoryBackend()
    b.register(QueueConfig("api", concurrency=1))
    return b


def test_label_header_is_shown_next_to_the_slot(backend: MemoryBackend,
                                                store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(flow_label="call +1 555 " + "x" * 400), TASK, lambda: None)
    (slot,) = backend.busy_slots("api")
    assert slot.label.startswith("call +1 555 ") and len(slot.label.encode()) == 256


def test_admitted_message_runs_and_releases_once(backend: MemoryBackend,
                                                 store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    m = message()
    assert gate.on_message(m, TASK, lambda: None) is Outcome.RUN
    assert backend.stats("api").in_use == 1
    gate.releaser.finish(m.headers["id"], m.delivery_tag)
    gate.releaser.finish(m.headers["id"], m.delivery_tag)
    assert backend.stats("api").in_use == 0


def test_second_delivery_waits_while_the_first_runs_here(store: ParkingStore) -> None:
    """A broker restart: the first delivery of t waits in the pool when its channel drops, and
    the broker delivers t again (new delivery tag). Admission would give the copy the slot t
    holds (counted once), so both would run on it: the copy is deferred, unacked, until the
    first finishes, and then runs on a slot of its own. A retry (another ticket) is not held
    back."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=2))
    gate = make_gate(backend, store)
    first = message()
    copy = message(id=first.headers["id"])
    acks = Acks(store, first.headers["id"])
    assert gate.on_message(first, TASK, acks) is Outcome.RUN
    assert gate.on_message(copy, TASK, acks) is Outcome.DEFER
    assert acks.calls == 0 and backend.stats("api").in_use == 1
    retry = message(id=first.headers["id"], retries=1)
    assert gate.on_message(retry, TASK, acks) is Outcome.RUN
    gate.releaser.finish(retry.headers["id"], retry.delivery_tag)
    gate.releaser.finish(first.headers["id"], first.delivery_tag)
    assert backend.stats("api").in_use == 0
    assert gate.on_message(copy, TASK, acks) is Outcome.RUN
    assert backend.stats("api").in_use == 1 and acks.calls == 0


def test_what_celery_dropped_on_a_reconnect_gives_its_slot_back(store: ParkingStore) -> None:
    """The same broker restart, but the first delivery never reached a pool process
    (Consumer.on_close dropped it): once the consumer starts again, finish_dropped releases
    its slot, and the copy runs at once instead of waiting for a run that will never end.
    One a pool process took is kept; one whose request was never built is left alone."""
    from celery.worker.state import active_requests

    class Request:  # Celery's, as far as will_finish looks (active_requests holds weak refs)
        _apply_result = None

    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=3))
    gate = make_gate(backend, store)
    dropped, running, unbuilt = message(), message(), message()
    for m in (dropped, running, unbuilt):
        assert gate.on_message(m, TASK, lambda: None) is Outcome.RUN
    never_handed, taken = Request(), Request()  # the first waited for a free pool process
    gate.ledger.get((dropped.headers["id"], dropped.delivery_tag)).request = never_handed
    gate.ledger.get((running.headers["id"], running.delivery_tag)).request = taken
    copy = message(id=dropped.headers["id"])
    assert gate.on_message(copy, TASK, lambda: None) is Outcome.DEFER
    active_requests.add(taken)
    try:
        assert gate.releaser.finish_dropped(pool=SimpleNamespace()) == 1
        assert backend.stats("api").in_use == 2  # the running one's and the unbuilt one's
        assert gate.ledger.get((dropped.headers["id"], dropped.delivery_tag)) is None
        assert gate.on_message(copy, TASK, lambda: None) is Outcome.RUN
        assert gate.releaser.finish_dropped(pool=SimpleNamespace()) == 0  # the copy's request: not built
    finally:
        active_requests.discard(taken)


def test_denied_message_is_committed_before_it_is_acked(backend: MemoryBackend,
                                                        store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message(flow_priority=3, flow_fairness_key="acme")
    acks = Acks(store, m.headers["id"])
    assert gate.on_message(m, TASK, acks) is Outcome.PARKED
    assert acks.calls == 1 and acks.row_was_there == [True]
    row = store.get(m.headers["id"])
    assert row is not None
    assert (row.queue, row.priority, row.fairness_key, row.reason) == ("api", 3, "acme",
                                                                      "concurrency")
    assert row.body == m.body and row.headers == m.headers and row.routing_key == "celery"
    assert backend.stats("api").waiting == 1


def test_a_message_with_the_deprecated_key_header_waits_under_that_key(
        backend: MemoryBackend, store: ParkingStore) -> None:
    """An older (or non-Python) producer sends the fairness key as ``flow_key``: the gate
    still queues the message under it, and parks it intact."""
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message(flow_key="acme")
    assert gate.on_message(m, TASK, lambda: None) is Outcome.PARKED
    assert [w.fairness_key for w in backend.waiters("api")] == ["acme"]
    row = store.get(m.headers["id"])
    assert row is not None and row.fairness_key == "acme" and row.headers == m.headers


def test_redelivered_parked_message_parks_once(backend: MemoryBackend,
                                               store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message()
    again = message(id=m.headers["id"])
    acks = Acks(store, m.headers["id"])
    assert gate.on_message(m, TASK, acks) is Outcome.PARKED
    assert gate.on_message(again, TASK, acks) is Outcome.PARKED
    assert store.count("api") == 1 and acks.calls == 2
    assert backend.stats("api").waiting == 1


def test_text_body_from_py_amqp_is_parked_as_its_bytes(backend: MemoryBackend,
                                                        store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message()
    m.body = m.body.decode("utf-8") + "é"  # py-amqp decodes text bodies to str
    assert gate.on_message(m, TASK, lambda: None) is Outcome.PARKED
    row = store.get(m.headers["id"])
    assert row is not None and row.body == m.body.encode("utf-8")


def test_copy_of_a_row_being_woken_is_not_acked(backend: MemoryBackend,
                                                 store: ParkingStore) -> None:
    """The republished copy can be denied again before the waker deletes the row it came
    from: parking it must not ack it, or that delete would lose the task."""
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message()
    gate.on_message(m, TASK, lambda: None)
    (claimed,) = store.claim_due(now=time.time() + 3600)
    copy = message(id=m.headers["id"])
    acks = Acks(store, m.headers["id"])
    assert gate.on_message(copy, TASK, acks) is Outcome.DEFER
    assert acks.calls == 0
    store.done([claimed.task_id])  # the waker finishes: the row is gone
    assert gate.on_message(copy, TASK, acks) is Outcome.PARKED
    assert acks.row_was_there == [True]


def test_future_eta_is_parked_until_then_without_admission(backend: MemoryBackend,
                                                           store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    eta = datetime.now(timezone.utc) + timedelta(minutes=5)
    m = message(eta=eta.isoformat())
    assert gate.on_message(m, TASK, lambda: None) is Outcome.PARKED
    row = store.get(m.headers["id"])
    assert row is not None and row.reason == "eta"
    assert abs(row.wake_at - eta.timestamp()) < 0.01
    s = backend.stats("api")
    assert (s.in_use, s.waiting) == (0, 0), "an ETA task takes no slot while it waits"
    past = message(eta=(datetime.now(timezone.utc) - timedelta(seconds=5)).isoformat())
    assert gate.on_message(past, TASK, lambda: None) is Outcome.RUN


def test_unknown_queue_and_no_queue_run_ungated(backend: MemoryBackend,
                                                store: ParkingStore,
                                                caplog: pytest.LogCaptureFixture) -> None:
    gate = make_gate(backend, store)
    # Read at the logger that warns, whatever an earlier test in this process did to the root's
    # handlers or levels.
    source = logging.getLogger("celery_flowcontrol.protocol")
    source.addHandler(caplog.handler)
    propagate, source.propagate = source.propagate, False  # each record reaches caplog once
    try:
        with caplog.at_level(logging.WARNING, logger=source.name):
            assert gate.on_message(message("nobody-registered"), TASK, lambda: None) is Outcome.UNGATED
            assert gate.on_message(message("nobody-registered"), TASK, lambda: None) is Outcome.UNGATED
    finally:
        source.removeHandler(caplog.handler)
        source.propagate = propagate
    assert caplog.text.count("nobody-registered") == 1, "one warning per unknown name"
    assert gate.on_message(message(None), TASK, lambda: None) is Outcome.UNGATED


@pytest.mark.parametrize("bad", ["high", 2.5, None, [1]], ids=str)
def test_bad_priority_is_admitted_as_zero(backend: MemoryBackend, store: ParkingStore,
                                          bad: object) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message(flow_priority=bad)
    assert gate.on_message(m, TASK, lambda: None) is Outcome.PARKED
    assert [w.priority for w in backend.waiters("api")] == [0]


def test_oversized_fairness_key_is_hashed_not_refused(backend: MemoryBackend,
                                                      store: ParkingStore) -> None:
    gate = make_gate(backend, store)
    gate.on_message(message(), TASK, lambda: None)
    m = message(flow_fairness_key="k" * 10_000)
    assert gate.on_message(m, TASK, lambda: None) is Outcome.PARKED
    (w,) = backend.waiters("api")
    assert w.fairness_key.startswith("sha256:")
    row = store.get(m.headers["id"])
    assert row is not None and row.headers["flow_fairness_key"] == "k" * 10_000, "the message is intact"


def test_parking_database_down_defers_without_ack(backend: MemoryBackend,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    down = ParkingStore("postgresql+psycopg://postgres@127.0.0.1:1/test")
    gate = make_gate(backend, down)
    gate.on_message(message(), TASK, lambda: None)
    acked: list[int] = []
    for _ in range(3):
        assert gate.on_message(message(), TASK, lambda: acked.append(1)) is Outcome.DEFER
    assert acked == [], "nothing is acked that was not stored"
    assert caplog.text.count("unreachable") == 1, "logged once per outage"
    assert backend.stats("api").in_use == 1, "no cap exceeded"


def test_admission_backend_down_defers_without_ack(store: ParkingStore) -> None:
    from celery_flowcontrol.admission.redis import RedisBackend

    down = RedisBackend.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    gate = make_gate(down, store)
    acked: list[int] = []
    started = time.monotonic()
    assert gate.on_message(message(), TASK, lambda: acked.append(1)) is Outcome.DEFER
    assert acked == [] and store.count() == 0
    assert time.monotonic() - started < 5


def test_acquire_header_admits_then_parks_then_times_out(backend: MemoryBackend,
                                                         store: ParkingStore) -> None:
    backend.register(QueueConfig("exports", concurrency=1, release="manual", max_hold=60))
    gate = make_gate(backend, store)
    first = message(None, flow_acquire={"exports": {"deadline": time.time() + 30,
                                                    "label": "x"}})
    assert gate.on_message(first, TASK, lambda: None) is Outcome.RUN
    adm = gate.ledger.get((first.headers["id"], first.delivery_tag))
    assert adm is not None and list(adm.acquired) == ["exports"]
    second = message(None, flow_acquire={"exports": {"deadline": time.time() + 30}})
    assert gate.on_message(second, TASK, lambda: None) is Outcome.PARKED
    row = store.get(second.headers["id"])
    assert row is not None and row.reason == "concurrency"  # an acquire_slot wait is for a slot (reasons.py)
    late = message(None, id=second.headers["id"], flow_acquire={"exports": {"deadline": 1.0}})
    assert gate.on_message(late, TASK, lambda: None) is Outcome.RUN
    adm = gate.ledger.get((late.headers["id"], late.delivery_tag))
    assert adm is not None and adm.expired == ["exports"]
    assert backend.waiters("exports") == [], "a timed-out waiter leaves the line"
