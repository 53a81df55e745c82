"""A call past a waiting bound is refused by the worker's gate: it ends FAILURE with
``FlowQueueFull`` in a real result backend, stored before its message is acked, and it is never
run nor parked (worker/refusal.py), on a real gate, parking database and kombu messages."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import FlowQueueFull
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Outcome
from tests.support.messages import make_gate, message

API = QueueConfig("api", concurrency=1, fairness="key", max_waiting=3, per_key_max_waiting=1)


@pytest.fixture
def world(sqlite_url: str) -> Iterator[Any]:
    app = Celery("refusals", broker="memory://", backend="cache+memory://", set_as_current=False)
    task = SimpleNamespace(name="proj.t", flow_queue=None, flow_priority=0, fairness_key=None,
                           flow_cost=None, ignore_result=False, backend=app.backend)
    store = ParkingStore(sqlite_url)
    backend = MemoryBackend()
    backend.register(API)
    yield SimpleNamespace(app=app, task=task, store=store, backend=backend,
                          gate=make_gate(backend, store, API))
    store.close()


def states_at_ack(world: Any, task_id: str) -> tuple[list[str], Any]:
    """An ack callback recording the task's state in the result backend when it is called."""
    seen: list[str] = []
    return seen, lambda: seen.append(world.app.AsyncResult(task_id).state)


def test_a_key_past_its_bound_ends_failure_before_its_ack_while_another_key_waits(world: Any) -> None:
    gate, task = world.gate, world.task
    assert gate.on_message(message(flow_fairness_key="a"), task, lambda: None) is Outcome.RUN
    assert gate.on_message(message(flow_fairness_key="a"), task, lambda: None) is Outcome.PARKED
    third = message(flow_fairness_key="a")
    tid = third.headers["id"]
    seen, ack = states_at_ack(world, tid)
    assert gate.on_message(third, task, ack) is Outcome.REFUSED
    assert seen == ["FAILURE"], "acked once, after FAILURE was stored"
    result = world.app.AsyncResult(tid)
    with pytest.raises(FlowQueueFull) as info:
        result.get(timeout=1, propagate=True)
    assert (info.value.queue, info.value.key, info.value.bound) == ("api", "a", 1)
    assert info.value.field == "per_key_max_waiting"
    assert world.store.get(tid) is None, "never parked"
    assert world.backend.stats("api").waiting == 1, "never put in line"
    # Another key of the same queue still waits in line, not refused.
    assert gate.on_message(message(flow_fairness_key="b"), task, lambda: None) is Outcome.PARKED
    assert gate.stats()["refused"] == {"api": 1}


def test_the_queue_bound_refuses_every_key(world: Any) -> None:
    gate, task = world.gate, world.task
    assert gate.on_message(message(flow_fairness_key="k0"), task, lambda: None) is Outcome.RUN
    for i in range(1, 4):
        assert gate.on_message(message(flow_fairness_key=f"k{i}"), task, lambda: None) is Outcome.PARKED
    late = message(flow_fairness_key="k9")
    assert gate.on_message(late, task, lambda: None) is Outcome.REFUSED
    with pytest.raises(FlowQueueFull) as info:
        world.app.AsyncResult(late.headers["id"]).get(timeout=1)
    assert (info.value.field, info.value.bound) == ("max_waiting", 3)


def test_a_result_backend_that_fails_leaves_the_refused_message_unacked(world: Any) -> None:
    gate = world.gate
    assert gate.on_message(message(flow_fairness_key="a"), world.task, lambda: None) is Outcome.RUN
    assert gate.on_message(message(flow_fairness_key="a"), world.task, lambda: None) is Outcome.PARKED

    class Down:
        def store_result(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionError("result backend down")

    broken = SimpleNamespace(**{**vars(world.task), "backend": Down()})
    acks: list[bool] = []
    assert gate.on_message(message(flow_fairness_key="a"), broken, lambda: acks.append(True)) \
        is Outcome.DEFER
    assert acks == [] and gate.stats()["refused"] == {}


def test_a_task_that_ignores_results_is_refused_and_acked_without_a_result(world: Any) -> None:
    gate = world.gate
    quiet = SimpleNamespace(**{**vars(world.task), "ignore_result": True})
    assert gate.on_message(message(flow_fairness_key="a"), quiet, lambda: None) is Outcome.RUN
    assert gate.on_message(message(flow_fairness_key="a"), quiet, lambda: None) is Outcome.PARKED
    m = message(flow_fairness_key="a")
    acks: list[bool] = []
    assert gate.on_message(m, quiet, lambda: acks.append(True)) is Outcome.REFUSED
    assert acks == [True] and world.app.AsyncResult(m.headers["id"]).state == "PENDING"
