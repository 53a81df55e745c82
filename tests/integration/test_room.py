"""``apply_async`` refuses a call a full waiting bound would refuse (room.py), on the in-process
backend: ``FlowQueueFull`` names queue, key and bound and nothing is sent; another key, and a
queue without a bound, publish as before (the latter without asking the backend); a backend
that can't be reached never blocks publishing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals

from celery_flowcontrol import FlowControl, FlowQueueFull, FlowTask
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.errors import BackendUnavailableError

QUEUES = [{"name": "api", "concurrency": 1, "fairness": "key", "max_waiting": 3,
           "per_key_max_waiting": 1},
          {"name": "free", "concurrency": 1}]


class Counting(MemoryBackend):
    """The in-process backend, counting ``would_refuse`` reads; *down* makes them fail."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.down = False

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


def test_a_queue_without_a_bound_never_asks(world: Any) -> None:
    world.report.apply_async(flow_queue="free")
    assert world.backend.reads == 0 and len(world.sent) == 1


def test_an_unreachable_backend_never_blocks_publishing(world: Any, caplog: Any) -> None:
    world.backend.down = True
    with caplog.at_level(logging.WARNING, logger="celery_flowcontrol.room"):
        world.report.apply_async(fairness_key="acme")
        world.report.apply_async(fairness_key="acme")
    assert len(world.sent) == 2 and world.backend.reads == 2
    assert sum("sending anyway" in r.getMessage() for r in caplog.records) == 1, "logged once"
