"""The interleavings the chaos runs found, replayed exactly in one process (real SQLite
parking, the in-process backend, real kombu messages), so each has a deterministic test."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Outcome
from tests.support.messages import TASK, make_gate, message


def test_a_woken_copy_denied_while_the_waker_deletes_its_row_is_not_acked(tmp_path: Path) -> None:
    """The race of a task lost in the kill -9 chaos run (PostgreSQL parking):

    waker: claim_due -> [t]; republish t; ...            gate (consumer thread, same node):
                                                         copy of t denied; park(t) conflicts
    waker: done([t]) deletes the row                      (the row still existed)
                                                         the park's look at the row: none
                                                         ack: the only copy of t is gone

    The copy must not be acked when its row vanished between the insert and the check: it
    is the live message now (park it again, or defer it)."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    store = ParkingStore(f"sqlite:///{tmp_path / 'park.sqlite3'}")
    gate = make_gate(backend, store)
    assert gate.on_message(message(id="holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message(id="t"), TASK, lambda: None) is Outcome.PARKED
    (claimed,) = store.claim_due(now=time.time() + 3600)  # the waker takes the row ...
    real_park = store.park

    waker_done: list[str] = []

    def park_then_the_waker_finishes(m: Any) -> bool:
        parked = real_park(m)
        if not waker_done:  # ... and deletes it, once, right after this insert conflicted
            waker_done.append(claimed.task_id)
            store.done([claimed.task_id])
        return parked

    store.park = park_then_the_waker_finishes  # type: ignore[method-assign]
    acks: list[bool] = []
    outcome = gate.on_message(message(id="t"), TASK, lambda: acks.append(True))
    store.park = real_park  # type: ignore[method-assign]
    kept = store.get("t") is not None
    store.close()
    assert outcome is Outcome.DEFER or kept, (
        f"the last copy of t was acked ({outcome}, acks={acks}) with no row left: lost")


def _parked_then_crashed(tmp_path: Path) -> tuple[Any, ParkingStore, Any, str]:
    """Cap 1 held by ``holder``; ``t`` denied and its row committed, the node dead before the
    ack; the holder's slot released (granted to ``t``). A fresh gate meets ``t`` again."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    store = ParkingStore(f"sqlite:///{tmp_path / 'park.sqlite3'}")
    gate = make_gate(backend, store)
    assert gate.on_message(message(id="holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message(id="t"), TASK, lambda: None) is Outcome.PARKED  # ack lost
    backend.release(gate.admission_of("holder", next(iter(gate.ledger.items()))[0][1]).primary)
    again = message(id="t")
    again.delivery_info["redelivered"] = True
    return backend, store, again, "t"


def test_a_redelivery_that_finds_its_row_waiting_runs_once(tmp_path: Path) -> None:
    """The node died between a park's commit and its ack: the broker's second copy is
    admitted (the slot granted to its ticket) and takes its row out, so the row never wakes
    to run the task a second time."""
    backend, store, again, tid = _parked_then_crashed(tmp_path)
    acks: list[bool] = []
    outcome = make_gate(backend, store, instance="w2").on_message(again, TASK, lambda: acks.append(True))
    assert outcome is Outcome.RUN and not acks
    assert store.get(tid) is None and store.claim_due(now=time.time() + 3600) == []
    store.close()


def test_a_redelivery_whose_row_is_being_woken_is_acked_unrun(tmp_path: Path) -> None:
    """As above, but a waker leased the row first: its woken copy is the one to run; the
    second copy is acked without running (and gives back the slot it was admitted to)."""
    backend, store, again, tid = _parked_then_crashed(tmp_path)
    assert [m.task_id for m in store.claim_many([tid])] == [tid]
    acks: list[bool] = []
    gate = make_gate(backend, store, instance="w2")
    outcome = gate.on_message(again, TASK, lambda: acks.append(True))
    assert outcome is Outcome.PARKED and acks == [True]
    assert store.get(tid) is not None and not gate.ledger.held()
    assert backend.stats("api").in_use == 0
    store.close()
