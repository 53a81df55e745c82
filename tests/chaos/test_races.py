"""The interleavings the chaos runs found, replayed exactly in one process (real SQLite
parking, the in-process backend, real kombu messages), so each has a deterministic test."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kombu import Message

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Gate, Outcome
from celery_flowcontrol.worker.waker import Waker

TASK = SimpleNamespace(name="proj.t", flow_queue=None, flow_priority=0, fairness_key=None)


def message(task_id: str) -> Message:
    h = {"id": task_id, "task": TASK.name, "root_id": task_id, "flow_queue": "api"}
    return Message(body=json.dumps([[1], {}, {}]).encode(), content_type="application/json",
                   content_encoding="utf-8", headers=h, delivery_tag=uuid.uuid4().hex,
                   delivery_info={"exchange": "", "routing_key": "celery"}, properties={})


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
    waker = Waker(app=None, backend=backend, store=store, instance="w1", heartbeat_every=10,
                  reclaim_every=15)
    gate = Gate(backend=backend, store=store, waker=waker, instance="w1",
                configs={"api": QueueConfig("api", concurrency=1)}.get)
    assert gate.on_message(message("holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message("t"), TASK, lambda: None) is Outcome.PARKED
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
    outcome = gate.on_message(message("t"), TASK, lambda: acks.append(True))
    store.park = real_park  # type: ignore[method-assign]
    kept = store.get("t") is not None
    store.close()
    assert outcome is Outcome.DEFER or kept, (
        f"the last copy of t was acked ({outcome}, acks={acks}) with no row left: lost")
