"""Kombu messages as a broker delivers them to the gate, and the gate and waker of one test,
built the way the worker builds them, on whatever backend and parking store the test chose.

``message(queue, id=..., **headers)``  a Celery protocol 2 message of :data:`TASK` (``acked=``
                                       a list its channel appends each acked tag to)
``make_waker(backend, store)``         the one place a test builds a :class:`Waker`
``make_gate(backend, store, *queues)`` a :class:`Gate` (and its waker) on those queues
``Acks``                               an ack callback that records whether the row was
                                       committed when it was called
"""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

from kombu import Message

from celery_flowcontrol.admission.base import AdmissionBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Gate
from celery_flowcontrol.worker.runtime import build_gate
from celery_flowcontrol.worker.waker import Waker

#: The task every message here is of: a plain task, its routing left to the headers.
TASK = SimpleNamespace(name="proj.t", flow_queue=None, flow_priority=0, fairness_key=None, flow_cost=None)


def message(queue: str | None = "api", *, acked: list[Any] | None = None, tag: str | None = None,
            **headers: Any) -> Message:
    """A message of :data:`TASK` on flow queue *queue* (None: no ``flow_queue`` header), with a
    fresh task id unless ``id=`` is given, and any further *headers*. With *acked*, the
    message has a channel that appends each tag it acks there (kombu refuses a second ack of
    one message); *tag* is its delivery tag (default: a fresh one)."""
    task_id = headers.pop("id", None) or uuid.uuid4().hex
    h = {"id": task_id, "task": TASK.name, "root_id": task_id, **headers}
    if queue is not None:
        h["flow_queue"] = queue
    channel = None if acked is None else SimpleNamespace(
        no_ack_consumers=None, basic_ack=lambda delivery_tag, multiple=False: acked.append(delivery_tag))
    return Message(body=json.dumps([[1], {}, {}]).encode(), channel=channel, content_type="application/json",
                   content_encoding="utf-8", headers=h, delivery_tag=tag or uuid.uuid4().hex,
                   delivery_info={"exchange": "", "routing_key": "celery"},
                   properties={"correlation_id": task_id, "priority": 0})


def make_waker(backend: AdmissionBackend, store: ParkingStore, *, app: Any = None,
               instance: str = "w1", **options: Any) -> Waker:
    """A waker (not started) of *instance*, publishing through *app* (None: never publishes),
    with a heartbeat and reclaim slow enough that a test never meets one unasked."""
    settings: dict[str, Any] = {"heartbeat_every": 10, "reclaim_every": 15, **options}
    return Waker(app=app, backend=backend, store=store, instance=instance, **settings)


def make_gate(backend: AdmissionBackend, store: ParkingStore, *queues: QueueConfig,
              waker: Waker | None = None, instance: str = "w1", **options: Any) -> Gate:
    """A gate of *instance* on *queues* (default: ``api`` of concurrency 1), with its parts
    built as the worker builds them (runtime.py's ``build_gate``) and its own
    :func:`make_waker` unless *waker* is given; *options* go to ``build_gate`` (``lingering=``...)."""
    configs = {q.name: q for q in queues or (QueueConfig("api", concurrency=1),)}
    if waker is None:  # the worker gives its waker the gate's lingering too
        waker = make_waker(backend, store, instance=instance, lingering=options.get("lingering"))
    return build_gate(backend=backend, store=store, waker=waker, instance=instance,
                      configs=configs.get, **options)


class Acks:
    """An ack callback that records whether the row was committed when it was called."""

    def __init__(self, store: ParkingStore, task_id: str) -> None:
        self.store, self.task_id, self.calls, self.row_was_there = store, task_id, 0, []

    def __call__(self) -> None:
        self.calls += 1
        self.row_was_there.append(self.store.get(self.task_id) is not None)
