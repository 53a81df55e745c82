"""Two first deliveries of one wake (a publish the broker took twice: kombu's retry of a
confirmed publish whose confirm was lost): the copy the gate took first is decided, the other
is acked unrun. Seen on RabbitMQ in the differential test: the twin of a retried task's first
attempt waited while the first ran, was then parked as a row of its own, and that stale row took
the task's next attempt for a redelivery of it (acked, lost) and ran the first attempt twice.
"""

from __future__ import annotations

import time

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Gate, Outcome
from tests.support.messages import TASK, Acks, make_gate, message


def woken_copies(store: ParkingStore, backend: MemoryBackend) -> tuple[str, dict[str, object]]:
    """A task parked behind a running one, and the ``flow_woken`` header of its wake."""
    gate = make_gate(backend, store)
    holder = message()
    assert gate.on_message(holder, TASK, lambda: None) is Outcome.RUN
    parked = message()
    assert gate.on_message(parked, TASK, lambda: None) is Outcome.PARKED
    gate.releaser.finish(holder.headers["id"], holder.delivery_tag)
    (row,) = store.claim_due(now=time.time() + 3600)
    store.wakes.record([row], [row.task_id])
    return row.task_id, {"row": row.seq, "wake": row.attempts}


def test_the_twin_of_a_running_copy_is_acked_unrun(store: ParkingStore) -> None:
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    task_id, woken = woken_copies(store, backend)
    gate = make_gate(backend, store)
    first, twin = (message(id=task_id, flow_woken=dict(woken)) for _ in range(2))
    acks = Acks(store, task_id)
    assert gate.on_message(first, TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(twin, TASK, acks) is Outcome.PARKED
    assert acks.row_was_there == [False] and store.get(task_id) is None
    assert gate.twins.acked == 1 and backend.stats("api").in_use == 1


def test_the_twin_of_a_first_attempt_that_retried_leaves_the_retry_its_row(
        store: ParkingStore) -> None:
    """The first attempt ran and retried; its wake's twin comes late, while another task holds
    the slot. Acked unrun, it leaves no row behind for the retry to meet: the retry is parked,
    and the first attempt never runs again."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    task_id, woken = woken_copies(store, backend)
    gate = make_gate(backend, store)
    first = message(id=task_id, flow_woken=dict(woken))
    assert gate.on_message(first, TASK, lambda: None) is Outcome.RUN
    gate.releaser.finish(task_id, first.delivery_tag)
    other = message()
    assert gate.on_message(other, TASK, lambda: None) is Outcome.RUN
    twin = message(id=task_id, flow_woken=dict(woken))
    acks = Acks(store, task_id)
    assert gate.on_message(twin, TASK, acks) is Outcome.PARKED
    assert acks.row_was_there == [False]
    retry = message(id=task_id, retries=1)
    assert gate.on_message(retry, TASK, lambda: None) is Outcome.PARKED
    row = store.get(task_id)
    assert row is not None and row.headers["retries"] == 1  # the retry's row, not the twin's


def test_a_copy_decided_again_or_delivered_again_is_no_twin(store: ParkingStore) -> None:
    """The taken copy itself, decided again (after a deferral), is still decided; a copy the
    broker delivers again (its channel dropped) is judged by the park path, as before."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    task_id, woken = woken_copies(store, backend)
    gate = make_gate(backend, store)
    first = message(id=task_id, flow_woken=dict(woken))
    assert gate.twins.twin(first, first.headers) is False
    assert gate.twins.twin(first, first.headers) is False  # the same delivery, asked again
    again = message(id=task_id, flow_woken=dict(woken))
    again.delivery_info["redelivered"] = True
    assert gate.twins.twin(again, again.headers) is False
    assert gate.twins.twin(message(id=task_id), {"id": task_id}) is False  # no wake


def stale_first_attempt(store: ParkingStore, backend: MemoryBackend) -> tuple[Gate, str]:
    """A gate whose one slot is held, and a first attempt of a task parked behind it."""
    gate = make_gate(backend, store)
    assert gate.on_message(message(), TASK, lambda: None) is Outcome.RUN
    first = message()
    assert gate.on_message(first, TASK, lambda: None) is Outcome.PARKED
    return gate, first.headers["id"]


def test_a_retry_denied_while_a_stale_row_of_its_first_attempt_waits_takes_its_place(
        store: ParkingStore) -> None:
    """A copy of the first attempt was parked after that attempt ran (a twin another worker
    took, a duplicate): the retry that meets its row is parked in its place, not acked as a
    redelivery of it, and the first attempt leaves the line."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    gate, task_id = stale_first_attempt(store, backend)
    retry = message(id=task_id, retries=1)
    acks = Acks(store, task_id)
    assert gate.on_message(retry, TASK, acks) is Outcome.PARKED
    row = store.get(task_id)
    assert row is not None and row.headers["retries"] == 1 and acks.row_was_there == [True]
    assert [w.task_id for w in backend.waiters("api")] == [f"{task_id}~r1"]


def test_a_first_attempt_denied_while_its_retry_waits_is_acked_unrun(store: ParkingStore) -> None:
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    gate, task_id = stale_first_attempt(store, backend)
    retry = message(id=task_id, retries=1)
    assert gate.on_message(retry, TASK, lambda: None) is Outcome.PARKED
    late = message(id=task_id)
    acks = Acks(store, task_id)
    assert gate.on_message(late, TASK, acks) is Outcome.PARKED
    row = store.get(task_id)
    assert row is not None and row.headers["retries"] == 1 and acks.calls == 1
