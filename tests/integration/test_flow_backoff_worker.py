"""A task that raises FlowBackoff pauses its queue fleet-wide, gives its slot back and runs
again when the backoff is over: not a retry, not a failure.

A real in-thread worker (memory:// broker, the flow-control bootstep, a SQLite parking
table) on the real Redis admission backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_flowcontrol import FlowBackoff, FlowControl, FlowTask, QueueConfig
from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.admission.base import BACKOFF


@pytest.fixture
def world(redis_url: str, key_prefix: str, sqlite_url: str) -> Iterator[Any]:
    app = Celery(key_prefix, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend_url=redis_url, flowcontrol_key_prefix=key_prefix,
                    flowcontrol_parking_url=sqlite_url, flowcontrol_poll_interval=0.2,
                    flowcontrol_queues=[QueueConfig("api", concurrency=2,
                                                    rate_limit={"limit": 10, "period": 1,
                                                                "adaptive": True})],
                    task_acks_late=True, worker_prefetch_multiplier=1,
                    task_reject_on_worker_lost=True,
                    worker_hijack_root_logger=False)
    FlowControl(app)
    runs: list[tuple[str, float, int, Any]] = []

    @app.task(base=FlowTask, bind=True, flow_queue="api", name=f"{key_prefix}.call")
    def call(self: Any, name: str, pushback: float = 0, scope: str = "queue") -> str:
        runs.append((name, time.time(), self.request.retries, self.request.flow_slot))
        if pushback and sum(1 for r in runs if r[0] == name) == 1:
            raise FlowBackoff(pushback, scope)
        return name

    root = logging.getLogger()
    level = root.level  # the in-thread worker sets the root logger's level: later tests' caplog
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield app, call, runs
    finally:
        root.setLevel(level)


def test_a_backoff_parks_the_task_until_due_and_pauses_the_queue(world: Any) -> None:
    app, call, runs = world
    backend = FlowControl(app).backend
    first = call.delay("a", pushback=1.5)
    deadline = time.time() + 10
    while not runs and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    stats = backend.stats("api")
    assert stats.backoff_until is not None and stats.in_use == 0, "paused, its slot back"
    assert stats.rates[0].live == 5, "the adaptive limit halved"
    d = backend.try_admit(Ticket("api", "probe", "probe-instance"))
    assert not d.admitted and d.reason == BACKOFF, "fleet-wide: any instance is held back"
    backend.withdraw("api", "probe")
    second = call.delay("b")
    assert first.get(timeout=20) == "a" and second.get(timeout=20) == "b"
    a1, a2 = [r for r in runs if r[0] == "a"]
    [b] = [r for r in runs if r[0] == "b"]
    assert a2[1] - a1[1] >= 1.4, "ran again once the backoff was over"
    assert b[1] >= stats.backoff_until - 0.05, "the queue admitted nothing meanwhile"
    assert (a1[2], a2[2]) == (0, 0), "not a retry"
    assert first.state == "SUCCESS"


def test_a_key_backoff_holds_only_that_key(world: Any) -> None:
    app, call, runs = world
    backend = FlowControl(app).backend
    first = call.apply_async(("k", 1.5, "key"), fairness_key="tenant-a")
    deadline = time.time() + 10
    while not runs and time.time() < deadline:
        time.sleep(0.05)
    other = call.apply_async(("o",), fairness_key="tenant-b")
    assert other.get(timeout=10) == "o"
    assert backend.stats("api").backoff_until is None, "the queue is not paused"
    assert first.get(timeout=20) == "k"
    k1, k2 = [r for r in runs if r[0] == "k"]
    [o] = [r for r in runs if r[0] == "o"]
    assert o[1] < k2[1] and k2[1] - k1[1] >= 1.4
