"""Parking keeps a message exactly: every property and header kombu and Celery define survives
park and wake, in its own units, on a real Redis broker and a real RabbitMQ broker.

Each row of :data:`CASES` sends one task with Celery's own ``send_task`` (the options a user
passes), takes the message off the broker as a worker would, parks it the way the gate does
(``parked_of`` + a real SQLite parking table), wakes it with the waker's ``republish``, takes the
republished message off the broker again and compares: the body, content type and encoding,
every header, every property (the broker's delivery-only ones aside), and what Celery's Request
of the woken message shows a task (``delivery_info``, ``properties``, ``expires``, ``eta``...).
The two properties a wake changes on purpose are checked for what they must be: ``priority`` is
the one it is woken with on the wire (its own on Redis, one above its own on RabbitMQ:
``woken_priority``) and the sent one in the task's request, and ``expiration``
is the time left (in kombu's milliseconds), never more.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import FunctionType
from typing import Any

import pytest
from celery import Celery, chord, group, signature
from celery.worker.request import Request
from kombu import Exchange, Queue

from celery_flowcontrol.parking import ParkedMessage, ParkingStore
from celery_flowcontrol.worker.message import WOKEN_HEADER, parked_of, woken_priority
from celery_flowcontrol.worker.republish import republish
from celery_flowcontrol.worker.request import FlowRequest

#: Properties a broker sets for each delivery: not part of the message.
DELIVERY = {"delivery_info", "delivery_tag", "body_encoding"}


def _now_plus(seconds: float) -> Callable[[], datetime]:
    """An instant *seconds* after the test starts (read when the case is sent)."""
    return lambda: datetime.now(timezone.utc) + timedelta(seconds=seconds)


#: (case, send_task options). Every option and property Celery and kombu define for a message;
#: a function value is read when the case is sent.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("expiration and expires in seconds", {"expires": 60}),
    ("expires as a datetime", {"expires": _now_plus(120)}),
    ("priority", {"priority": 3}),
    ("correlation_id", {"correlation_id": "corr-1"}),
    ("reply_to", {"reply_to": "some.reply.queue"}),
    ("delivery_mode transient", {"delivery_mode": 1}),
    ("message_id", {"message_id": "msg-1"}),
    ("timestamp", {"timestamp": 1_700_000_000}),
    ("type", {"type": "a-type"}),
    ("app_id", {"app_id": "an-app"}),
    ("user_id", {"user_id": "guest"}),  # RabbitMQ checks it against the connection's user
    ("content type and encoding (pickle)", {"serializer": "pickle"}),
    ("compression", {"compression": "zlib"}),
    ("eta", {"eta": _now_plus(30)}),
    ("countdown", {"countdown": 30}),
    ("retries", {"retries": 4}),
    ("time limits", {"time_limit": 30, "soft_time_limit": 20}),
    ("root and parent ids", {"root_id": "root-1", "parent_id": "parent-1"}),
    ("group id and index", {"group_id": "group-1", "group_index": 2}),
    ("chord", {"chord": chord([signature("t")], signature("callback")), "group_id": "g-2"}),
    ("stamps and stamped headers", {"stamped_headers": ["on", "tags"], "on": "v1", "tags": ["a", "b"]}),
    ("shadow", {"shadow": "shadowed.name"}),
    ("ignore_result", {"ignore_result": True}),
    ("link and link_error", {"link": signature("on_ok", args=(1,)), "link_error": signature("on_err")}),
    ("replaced-task nesting", {"replaced_task_nesting": 2}),
    ("custom headers", {"headers": {"tenant": "t-1", "nested": {"a": [1, 2]}, "binary": None}}),
    ("flow options", {"headers": {"flow_queue": "api", "flow_priority": 5, "flow_fairness_key": "k"}}),
    ("all at once", {"expires": 60, "priority": 7, "correlation_id": "c", "reply_to": "r",
                     "message_id": "m", "timestamp": 1_700_000_001, "type": "t", "app_id": "a",
                     "countdown": 10, "retries": 1, "time_limit": 5, "shadow": "s",
                     "stamped_headers": ["x"], "x": "y", "headers": {"h": 1}}),
]


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[tuple[str, str]]:
    """(transport, URL) of a real broker: Redis (keys under this test's prefix) or RabbitMQ."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        url = request.getfixturevalue("rabbitmq_url")
    yield request.param, url


class World:
    """A client app, a broker queue of its own and a parking table: park and wake for real."""

    def __init__(self, transport: str, url: str, prefix: str, store: ParkingStore) -> None:
        self.transport = transport
        self.store = store
        self.app = Celery("roundtrip", broker=url, set_as_current=False)
        self.app.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"} if transport == "redis" else {}
        self.app.conf.accept_content = ["json", "pickle"]
        self.queue = Queue(f"{prefix}.rt", Exchange(f"{prefix}.rt"), routing_key=f"{prefix}.rt",
                           queue_arguments={"x-max-priority": 255} if transport == "amqp" else None)
        self.app.conf.task_queues = [self.queue]

        @self.app.task(name="t", shared=False)
        def t(*args: Any, **kwargs: Any) -> None:
            return None

        self.conn = self.app.connection_for_write()
        self.channel = self.conn.channel()
        self.queue(self.channel).declare()

    def close(self) -> None:
        try:
            self.queue(self.channel).delete()
        finally:
            self.conn.release()

    def get(self, timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.queue(self.channel).get(no_ack=True, accept=["json", "pickle"])
            if message is not None:
                return message
            time.sleep(0.02)
        raise AssertionError("no message on the broker queue")

    def park(self, message: Any, now: float | None = None) -> ParkedMessage:
        """Park *message* as the gate does, then claim its row as a waker does."""
        at = time.time() if now is None else now
        row = parked_of(message, task_id=message.headers["id"], queue="api", task_name="t",
                        priority=0, key=None, wake_at=at, reason="concurrency", now=at)
        assert self.store.park(replace(row, parked_at=at))
        claimed = self.store.claim(row.task_id, now=at)
        assert claimed is not None
        return claimed

    def wake(self, row: ParkedMessage, clock: Callable[[], float] = time.time) -> Any:
        assert republish(self.app, self.store, [row], clock) == 1
        assert self.store.get(row.task_id) is None
        return self.get()


@pytest.fixture
def world(broker: tuple[str, str], key_prefix: str, store: ParkingStore) -> Iterator[World]:
    w = World(*broker, key_prefix, store)
    yield w
    w.close()


def properties_of(message: Any) -> dict[str, Any]:
    props = {k: v for k, v in message.properties.items() if k not in DELIVERY}
    props.pop("application_headers", None)  # AMQP's copy of the headers, compared as headers
    return props


def request_of(app: Celery, message: Any, cls: type[Request] = FlowRequest) -> Request:
    """Celery's Request of *message*, as a worker builds it (what the task's request shows)."""
    return cls(message, app=app, task=app.tasks["t"])


@pytest.mark.parametrize(("case", "options"), CASES, ids=[c for c, _ in CASES])
def test_a_message_survives_park_and_wake(world: World, case: str, options: dict[str, Any]) -> None:
    sent_id = str(uuid.uuid4())
    options = {k: v() if isinstance(v, FunctionType) else v for k, v in options.items()}
    world.app.send_task("t", (1, "two"), {"k": 3}, task_id=sent_id, queue=world.queue, **options)
    before = world.get()
    after = world.wake(world.park(before))

    assert after.body == before.body
    assert (after.content_type, after.content_encoding) == (before.content_type, before.content_encoding)
    wire_headers = dict(after.headers)
    as_woken = woken_priority(world.transport, before.properties.get("priority"))
    woken_header = wire_headers.pop(WOKEN_HEADER)
    assert isinstance(woken_header.pop("row"), int)  # the wake it was published by: the row ...
    assert woken_header.pop("wake") == 1  # ... and its claim
    assert woken_header in ({}, {"priority": before.properties.get("priority"), "as": as_woken})
    assert wire_headers == before.headers
    sent, woken = properties_of(before), properties_of(after)
    assert woken.pop("priority", None) == as_woken
    sent_priority = sent.pop("priority", None)
    sent_ttl, woken_ttl = sent.pop("expiration", None), woken.pop("expiration", None)
    assert woken == sent
    if sent_ttl is None:
        assert woken_ttl is None
    else:  # the time left, in milliseconds, never more than was sent
        assert 0 < int(woken_ttl) <= int(sent_ttl)
        assert int(woken_ttl) > int(sent_ttl) - 5_000
    # What the task sees: the priority it was sent with, and no trace of the wake.
    seen, plain = request_of(world.app, after), request_of(world.app, before, Request)
    assert seen.delivery_info["priority"] == plain.delivery_info["priority"] == sent_priority
    assert seen.request_dict["properties"].get("priority") == sent_priority
    assert WOKEN_HEADER not in seen.request_dict
    for attr in ("id", "name", "eta", "expires", "time_limits", "root_id", "parent_id", "argsrepr",
                 "kwargsrepr", "stamps", "stamped_headers", "ignore_result", "args", "kwargs"):
        assert getattr(seen, attr) == getattr(plain, attr), attr
    for key in ("retries", "group", "group_index", "chord", "callbacks", "errbacks", "shadow",
                "replaced_task_nesting", "reply_to", "correlation_id", "timelimit"):
        assert seen.request_dict.get(key) == plain.request_dict.get(key), key


def test_a_ttl_shrinks_by_the_time_parked_and_never_grows(world: World) -> None:
    """Park and wake three times (a TTL read in the wrong unit would grow 1000-fold at each wake): each wake
    carries what is left, measured on the clock the waker is given."""
    world.app.send_task("t", task_id=str(uuid.uuid4()), queue=world.queue, expires=600)
    message = world.get()
    assert message.properties["expiration"] == "600000"
    start = time.time()
    for i in range(1, 4):
        row = world.park(message, now=start + 100 * (i - 1))
        message = world.wake(row, clock=lambda i=i: start + 100 * i)
        left = int(message.properties["expiration"])
        assert 600_000 - 100_000 * i - 2_000 < left <= 600_000 - 100_000 * i, (i, left)


def test_a_message_that_expires_while_parked_comes_back_expired_and_without_a_ttl(world: World) -> None:
    """The broker would drop it unseen; with no TTL and its ``expires`` in the past, the worker
    marks it REVOKED (expired), as plain Celery does (tests/e2e/test_expiry.py runs that)."""
    world.app.send_task("t", task_id=str(uuid.uuid4()), queue=world.queue, expires=30)
    message = world.get()
    start = time.time()
    row = world.park(message, now=start)
    assert row.wake_at <= start + 30  # it wakes at its expiry at the latest
    woken = world.wake(row, clock=lambda: start + 45)
    assert "expiration" not in properties_of(woken)
    assert woken.headers["expires"] == message.headers["expires"]  # past on the waker's clock
    assert request_of(world.app, woken).expires.timestamp() < start + 45


def test_a_broker_ttl_without_celerys_expires_gets_one_when_it_runs_out(world: World) -> None:
    """A foreign producer's TTL alone: expired in the table, it comes back with Celery's header."""
    with world.app.producer_or_acquire() as producer:
        producer.publish("[[], {}, {}]", routing_key=world.queue.routing_key, exchange=world.queue.exchange,
                         headers={"id": "foreign-1", "task": "t"}, content_type="application/json",
                         content_encoding="utf-8", expiration=20)
    message = world.get()
    start = time.time()
    woken = world.wake(world.park(message, now=start), clock=lambda: start + 21)
    assert "expiration" not in properties_of(woken)
    expires = datetime.fromisoformat(woken.headers["expires"])
    assert abs(expires.timestamp() - (start + 20)) < 1.0


def test_group_and_chord_messages_keep_their_structure(world: World) -> None:
    """A group's and a chord's member, sent by Celery's canvas (not hand-set headers)."""
    sig = world.app.signature("t", args=(1,), queue=world.queue)
    group([sig, world.app.signature("t", args=(2,), queue=world.queue)]).apply_async()
    for before in [world.get(), world.get()]:
        after = world.wake(world.park(before))
        headers = {k: v for k, v in after.headers.items() if k != WOKEN_HEADER}
        assert headers == before.headers and after.body == before.body
        assert after.headers["group"]  # (group_index: None on Celery 5.3, 0 and 1 later)


def test_a_message_woken_with_under_a_second_left_goes_without_a_ttl(world: World) -> None:
    """RabbitMQ would drop a message with milliseconds of TTL before a worker saw it (a row
    wakes at its expiry); Celery's own ``expires`` still says when it is stale."""
    world.app.send_task("t", task_id=str(uuid.uuid4()), queue=world.queue, expires=30)
    message = world.get()
    start = time.time()
    woken = world.wake(world.park(message, now=start), clock=lambda: start + 29.5)
    assert "expiration" not in properties_of(woken)
    assert woken.headers["expires"] == message.headers["expires"]


def test_a_row_parked_by_an_earlier_release_is_woken_too(world: World) -> None:
    """Rows parked before worker/message.py kept every property, AMQP's copies of the headers
    and content type among them: they go back as the message they were, not as a refusal."""
    world.app.send_task("t", task_id=str(uuid.uuid4()), queue=world.queue, headers={"h": 1})
    before = world.get()
    row = world.park(before)
    kept = {k: v for k, v in before.properties.items() if k not in DELIVERY}
    old = replace(row, properties={**kept, "content_type": "application/json",
                                   "content_encoding": "utf-8",
                                   "application_headers": dict(before.headers)})
    after = world.wake(old)
    assert {k: v for k, v in after.headers.items() if k != WOKEN_HEADER} == before.headers
    assert after.body == before.body
