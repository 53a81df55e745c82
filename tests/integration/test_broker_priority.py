"""The order a real broker serves one broker queue in, FlowTasks and plain tasks together.

docs/celery.md ("The order a task gets") says what this pins, on Redis and on RabbitMQ (a
queue declared with ``x-max-priority``, as Celery's ``task_queue_max_priority`` does):

* a fresh FlowTask keeps its place among plain tasks: one priority, the order sent, whatever
  its ``flow_priority``; Celery's own ``priority=`` orders it as it orders a plain task;
* a woken message is served before every fresh message of its own priority, and after the
  messages of a higher priority (the Redis transport: at the head of its priority's list;
  RabbitMQ: one priority above its own).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.message import parked_of
from celery_flowcontrol.worker.republish import republish

#: (a higher priority, a lower one) in each broker's terms: Redis serves 0 first, RabbitMQ 255.
LEVELS = {"redis": (0, 6), "amqp": (5, 3)}


class World:
    """A client app with a FlowTask and a plain task, one broker queue, a parking table."""

    def __init__(self, transport: str, url: str, prefix: str, store: ParkingStore) -> None:
        self.transport = transport
        self.store = store
        self.app = Celery("prio", broker=url, set_as_current=False)
        if transport == "redis":
            self.app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
        self.queue = Queue(f"{prefix}.q", Exchange(f"{prefix}.q"), routing_key=f"{prefix}.q",
                           queue_arguments={"x-max-priority": 10} if transport == "amqp" else None)
        self.app.conf.task_queues = [self.queue]
        self.app.conf.task_default_queue = self.queue.name
        FlowControl(self.app)

        @self.app.task(base=FlowTask, flow_queue="api", name="flow", shared=False)
        def flow() -> None: ...

        @self.app.task(name="plain", shared=False)
        def plain() -> None: ...

        self.conn = self.app.connection_for_write()
        self.channel = self.conn.channel()
        self.queue(self.channel).declare()

    def close(self) -> None:
        try:
            self.queue(self.channel).delete()
        finally:
            self.conn.release()
            self.app.close()

    def send(self, task: str, task_id: str, **options: Any) -> None:
        self.app.tasks[task].apply_async(task_id=task_id, **options)

    def get(self) -> Any:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            message = self.queue(self.channel).get(no_ack=True)
            if message is not None:
                return message
            time.sleep(0.02)
        raise AssertionError("no message on the broker queue")

    def served(self, n: int) -> list[str]:
        """The task ids the broker hands out, one ``get`` at a time (as a worker fetches)."""
        return [self.get().headers["id"] for _ in range(n)]

    def park(self, task_id: str) -> Any:
        """Take the message of *task_id* off the broker (it must be next) and park it as the
        gate does; the claimed row, ready for the waker."""
        message = self.get()
        assert message.headers["id"] == task_id
        now = time.time()
        row = parked_of(message, task_id=task_id, queue="api", task_name="flow", priority=0,
                        key=None, wake_at=now, reason="concurrency", now=now)
        assert self.store.park(replace(row, parked_at=now))
        claimed = self.store.claim(task_id, now=now)
        assert claimed is not None
        return claimed


@pytest.fixture(params=["redis", "amqp"])
def world(request: pytest.FixtureRequest, key_prefix: str, sqlite_url: str) -> Iterator[World]:
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "rabbitmq_url")
    store = ParkingStore(sqlite_url)
    w = World(request.param, url, key_prefix, store)
    yield w
    w.close()
    store.close()


def test_fresh_flow_tasks_are_served_in_the_order_sent_among_plain_ones(world: World) -> None:
    high, low = LEVELS[world.transport]
    world.send("flow", "flow-1")
    world.send("plain", "plain-1")
    world.send("flow", "flow-9", flow_priority=9)  # orders waiters, not the broker
    world.send("plain", "plain-2")
    world.send("flow", "flow-neg", flow_priority=-5)
    world.send("flow", "flow-high", priority=high)  # Celery's own priority: as for a plain task
    world.send("plain", "plain-high", priority=high)
    order = world.served(7)
    if world.transport == "redis":  # no priority is Redis's 0, its highest
        assert order == ["flow-1", "plain-1", "flow-9", "plain-2", "flow-neg", "flow-high",
                         "plain-high"]
    else:  # no priority is RabbitMQ's 0, its lowest
        assert order == ["flow-high", "plain-high", "flow-1", "plain-1", "flow-9", "plain-2",
                         "flow-neg"]
    world.send("plain", "plain-low", priority=low)
    world.send("flow", "flow-low", priority=low)
    world.send("plain", "plain-high2", priority=high)
    assert world.served(3) == ["plain-high2", "plain-low", "flow-low"]


def test_a_woken_message_is_served_before_fresh_ones_of_its_priority(world: World) -> None:
    high, low = LEVELS[world.transport]
    world.send("flow", "woken")
    row = world.park("woken")
    world.send("flow", "fresh-flow")
    world.send("plain", "fresh-plain")
    assert republish(world.app, world.store, [row]) == 1
    assert world.served(3) == ["woken", "fresh-flow", "fresh-plain"]

    # Sent at a low priority: back ahead of the fresh ones of that priority, behind a higher one.
    world.send("flow", "woken-low", priority=low)
    row = world.park("woken-low")
    world.send("flow", "fresh-low", priority=low)
    world.send("plain", "plain-high", priority=high)
    assert republish(world.app, world.store, [row]) == 1
    assert world.served(3) == ["plain-high", "woken-low", "fresh-low"]


def test_a_batch_woken_at_once_is_served_in_line_order_ahead_of_fresh_ones(world: World) -> None:
    for i in range(3):
        world.send("flow", f"waiter-{i}")
    rows = [world.park(f"waiter-{i}") for i in range(3)]
    world.send("plain", "fresh")
    assert republish(world.app, world.store, rows) == 3
    assert world.served(4) == ["waiter-0", "waiter-1", "waiter-2", "fresh"]
