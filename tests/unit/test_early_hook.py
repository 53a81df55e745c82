"""The early hook (worker/early.py) on a real kombu virtual channel (the memory transport).

- Every FlowTask message of the task channel is handed to ``ask`` just before kombu records
  it as unacked; other tasks' messages are not, and every message is still recorded and
  delivered.
- A failing ``ask`` loses nothing: the message is recorded and delivered as usual.
- Unhooked, the channel is kombu's own again; a channel that is not virtual (AMQP) gets no hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Consumer, Exchange, Producer, Queue

from celery_flowcontrol import FlowTask
from celery_flowcontrol.worker import early


@pytest.fixture
def tasks() -> dict[str, Any]:
    app = Celery("early-hook", set_as_current=False)

    @app.task(base=FlowTask, flow_queue="q", name="proj.flow")
    def flow() -> None: ...

    @app.task(name="proj.plain")
    def plain() -> None: ...

    return {"proj.flow": flow, "proj.plain": plain}


@pytest.fixture
def connection() -> Iterator[Connection]:
    with Connection("memory://") as conn:
        yield conn


def deliver(connection: Connection, channel: Any, names: list[str]) -> list[Any]:
    """Publish one message per task name and consume them (unacked) on *channel*."""
    queue = Queue("early-hook", Exchange("early-hook"), "early-hook", channel=channel)
    queue.declare()
    producer = Producer(channel, exchange=queue.exchange, routing_key="early-hook")
    for n, name in enumerate(names):
        producer.publish({}, headers={"task": name, "id": f"t{n}"})
    got: list[Any] = []
    with Consumer(channel, queues=[queue], callbacks=[lambda body, m: got.append(m)]):
        while len(got) < len(names):
            connection.drain_events(timeout=2)
    return got


def consumer_of(channel: Any, tasks: dict[str, Any]) -> Any:
    return SimpleNamespace(task_consumer=SimpleNamespace(channel=channel),
                           app=SimpleNamespace(tasks=tasks))


def test_flow_messages_are_asked_for_before_kombu_records_them(connection: Connection,
                                                               tasks: dict[str, Any]) -> None:
    channel = connection.channel()
    qos = channel.qos
    asked: list[tuple[str, str, bool]] = []

    def ask(message: Any, task: Any) -> None:  # records whether kombu had recorded it yet
        asked.append((message.headers["id"], task.name, message.delivery_tag in qos._delivered))

    unhook = early.hook(consumer_of(channel, tasks), SimpleNamespace(ask_early=ask))
    assert unhook is not None
    got = deliver(connection, channel, ["proj.flow", "proj.plain", "proj.nope", "proj.flow"])
    assert asked == [("t0", "proj.flow", False), ("t3", "proj.flow", False)]
    assert [m.headers["id"] for m in got] == ["t0", "t1", "t2", "t3"]
    assert all(m.delivery_tag in qos._delivered for m in got)  # all recorded as unacked
    unhook()
    assert "append" not in vars(qos)  # the class's own again
    deliver(connection, channel, ["proj.flow"])
    assert len(asked) == 2


def test_a_failing_ask_loses_nothing(connection: Connection, tasks: dict[str, Any]) -> None:
    channel = connection.channel()

    def ask(message: Any, task: Any) -> None:
        raise RuntimeError("a bug")

    assert early.hook(consumer_of(channel, tasks), SimpleNamespace(ask_early=ask)) is not None
    got = deliver(connection, channel, ["proj.flow", "proj.flow"])
    assert len(got) == 2 and all(m.delivery_tag in channel.qos._delivered for m in got)


def test_no_hook_where_the_channel_is_not_virtual(tasks: dict[str, Any]) -> None:
    nothing = SimpleNamespace(ask_early=lambda m, t: None)
    assert early.hook(consumer_of(SimpleNamespace(), tasks), nothing) is None
    assert early.hook(SimpleNamespace(), nothing) is None
