"""``apply_async`` refuses a call a full waiting bound would refuse (room.py), on the in-process
backend and on Redis: ``FlowQueueFull`` names queue, key and bound and nothing is sent; another
key, and a queue without a bound, publish as before (the latter asking the backend at most once
per ``BOUNDS_TTL``); a bound set at run time by another app instance is refused there too; a
backend that can't be reached never blocks publishing."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals

from celery_flowcontrol import FlowControl, FlowQueueFull, FlowTask, set_key
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.errors import BackendUnavailableError
from celery_flowcontrol.room import BOUNDS_TTL

QUEUES = [{"name": "api", "concurrency": 1, "fairness": "key", "max_waiting": 3,
           "per_key_max_waiting": 1},
          {"name": "free", "concurrency": 1},
          {"name": "open", "concurrency": 1, "fairness": "key"}]


class Counting(MemoryBackend):
    """The in-process backend, counting ``would_refuse`` and ``waiting_bounded`` reads; *down*
    makes them fail; its clock stands still (at its start, plus *skew*), so a test moves
    past BOUNDS_TTL when it means to, however slow the machine is."""

    def __init__(self) -> None:
        start = time.time()
        super().__init__(clock=lambda: start + self.skew)
        self.skew = 0.0
        self.reads = 0
        self.bound_reads = 0
        self.down = False

    def waiting_bounded(self, name: str) -> bool:
        self.bound_reads += 1
        if self.down:
            raise BackendUnavailableError("connection refused")
        return super().waiting_bounded(name)

    def would_refuse(self, name: str, key: str) -> FlowQueueFull | None:
        self.reads += 1
        if self.down:
            raise BackendUnavailableError("connection refused")
        return super().would_refuse(name, key)


@pytest.fixture
def world(sqlite_url: str) -> Iterator[Any]:
    backend = Counting()
    app = Celery("room", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_queues=QUEUES, flowcontrol_backend=backend,
                    flowcontrol_parking_url=sqlite_url)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def report() -> None: ...

    sent: list[str] = []

    def published(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
        if sender == report.name:
            sent.append(headers["id"])

    signals.after_task_publish.connect(published, weak=False)
    yield SimpleNamespace(app=app, backend=backend, report=report, sent=sent)
    signals.after_task_publish.disconnect(published)
    fc.store.close()


def test_a_full_key_is_refused_at_apply_async_and_nothing_is_sent(world: Any) -> None:
    b = world.backend
    b.try_admit(Ticket("api", "a1", "w1", fairness_key="acme"))  # runs
    b.try_admit(Ticket("api", "a2", "w1", fairness_key="acme"))  # waits: acme's bound is 1
    with pytest.raises(FlowQueueFull) as info:
        world.report.apply_async(fairness_key="acme")
    assert (info.value.queue, info.value.key, info.value.bound) == ("api", "acme", 1)
    assert "per_key_max_waiting" in str(info.value)
    assert world.sent == [] and b.stats("api").waiting == 1, "nothing sent, nothing changed"
    world.report.apply_async(fairness_key="other")
    assert len(world.sent) == 1


def test_a_full_queue_refuses_a_call_that_names_no_key(world: Any) -> None:
    b = world.backend
    b.try_admit(Ticket("api", "a1", "w1", fairness_key="k0"))
    for i in range(1, 4):
        b.try_admit(Ticket("api", f"a{i + 1}", "w1", fairness_key=f"k{i}"))
    with pytest.raises(FlowQueueFull) as info:
        world.report.apply_async()
    assert (info.value.field, info.value.bound) == ("max_waiting", 3)


def test_a_queue_without_a_bound_asks_once_per_ttl(world: Any) -> None:
    for _ in range(50):
        world.report.apply_async(flow_queue="free")
    assert (world.backend.reads, world.backend.bound_reads, len(world.sent)) == (0, 1, 50)
    world.backend.skew += BOUNDS_TTL
    world.report.apply_async(flow_queue="free")
    assert (world.backend.reads, world.backend.bound_reads) == (0, 2)


def test_a_bound_set_at_run_time_by_another_app_is_refused_at_apply_async(world: Any) -> None:
    """The queue's config as the producer knows it sets no bound; a key's bound set with
    set_key (here on the backend the worker holds, as its remote control does) is refused at
    apply_async once the producer's word on the queue is BOUNDS_TTL old."""
    b = world.backend
    world.report.apply_async(flow_queue="open", fairness_key="acme")  # unbounded, as read
    b.set_key("open", "acme", max_waiting=1)
    b.try_admit(Ticket("open", "o1", "w1", fairness_key="acme"))  # runs
    b.try_admit(Ticket("open", "o2", "w1", fairness_key="acme"))  # waits: its bound is 1
    b.skew += BOUNDS_TTL
    with pytest.raises(FlowQueueFull) as info:
        world.report.apply_async(flow_queue="open", fairness_key="acme")
    assert (info.value.queue, info.value.key, info.value.bound) == ("open", "acme", 1)
    world.report.apply_async(flow_queue="open", fairness_key="other")
    assert len(world.sent) == 2, "the refused call was not sent"


def test_a_bound_set_at_run_time_on_redis_is_refused_by_another_app(
        redis_url: str, redis_client: Any, key_prefix: str, sqlite_url: str) -> None:
    """Two app instances on one Redis (two processes, as far as Redis can tell): one sets a
    key's bound with set_key, the other's apply_async refuses a call past it, and its calls
    of a queue without a bound read one flag per BOUNDS_TTL, never would_refuse."""
    apps = []
    for name in ("operator", "producer"):
        app = Celery(name, broker="memory://", set_as_current=False)
        app.conf.update(flowcontrol_queues=QUEUES[1:], flowcontrol_backend_url=redis_url,
                        flowcontrol_key_prefix=key_prefix, flowcontrol_parking_url=sqlite_url)
        FlowControl(app)
        apps.append(app)
    operator, producer = apps
    fc = FlowControl(operator)
    for config in fc.settings.queues:
        fc.backend.register(config)

    @producer.task(base=FlowTask, flow_queue="open", shared=False)
    def report() -> None: ...

    reads: list[str] = []
    backend = FlowControl(producer).backend
    asked = backend.would_refuse
    backend.would_refuse = lambda name, key: reads.append(key) or asked(name, key)  # type: ignore[method-assign]
    report.apply_async(fairness_key="acme")
    report.apply_async(fairness_key="acme")
    assert reads == [], "no bound anywhere: would_refuse is never asked"
    set_key(operator, "open", "acme", max_waiting=1)
    fc.backend.try_admit(Ticket("open", "o1", "w1", fairness_key="acme"))  # runs
    fc.backend.try_admit(Ticket("open", "o2", "w1", fairness_key="acme"))  # waits
    time.sleep(BOUNDS_TTL)  # the producer's word that "open" has no bound expires
    with pytest.raises(FlowQueueFull) as info:
        report.apply_async(fairness_key="acme")
    assert (info.value.queue, info.value.key, info.value.bound) == ("open", "acme", 1)
    report.apply_async(fairness_key="other")
    assert reads == ["acme", "other"]
    for app in apps:
        FlowControl(app).store.close()


def test_an_unreachable_backend_never_blocks_publishing(world: Any, caplog: Any) -> None:
    world.backend.down = True
    with caplog.at_level(logging.WARNING, logger="celery_flowcontrol.room"):
        world.report.apply_async(fairness_key="acme")
        world.report.apply_async(fairness_key="acme")
    assert len(world.sent) == 2 and world.backend.reads == 2
    assert sum("sending anyway" in r.getMessage() for r in caplog.records) == 1, "logged once"
