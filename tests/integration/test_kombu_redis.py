"""kombu_redis.py's reach into kombu's Redis transport, on a real Redis broker channel.

The story: the drainer's take pops the oldest messages of the flooded flow queues off the
lists, in the order the consumer's BRPOP reads them, and stops each list at its first message
it must leave to the consumer (a plain task, an ETA, another flow queue's, a collapse option);
what it takes is in kombu's unacked hash and index exactly as a message the consumer was
delivered is, so kombu's own visibility restore brings it back when it is never acked; a give
back puts it at the tail (the consumer's next) and out of the unacked keys; an ack takes it
out of both. A kombu release that renames or reshapes any of it fails here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue
from kombu.utils.json import loads

from celery_flowcontrol.kombu_redis import BrokerLists
from celery_flowcontrol.worker.drain import PLAIN


@pytest.fixture
def broker(redis_url: str) -> Iterator[tuple[Connection, Any, Queue, Exchange, str]]:
    prefix = f"fct-{uuid.uuid4().hex[:8]}:"
    exchange = Exchange(f"{prefix}x", type="direct")
    queue = Queue(f"{prefix}q", exchange, routing_key="k")
    with Connection(redis_url, transport_options={"global_keyprefix": prefix,
                                                  "visibility_timeout": 1}) as conn:
        channel = conn.channel()
        queue(channel).declare()
        yield conn, channel, queue, exchange, prefix
        plain = BrokerLists(channel, [queue.name]).client
        plain.delete(*plain.keys(f"{prefix}*") or [f"{prefix}none"])


def publish(conn: Connection, channel: Any, exchange: Exchange, n: int, flow: str | None = "api",
            priority: int | None = None, **headers: Any) -> list[str]:
    producer = conn.Producer(channel)
    ids = []
    for _ in range(n):
        tid = uuid.uuid4().hex
        h: dict[str, Any] = {"id": tid, "task": "proj.work", "root_id": tid}
        if flow is not None:
            h["flow_queue"] = flow
        h.update(headers)
        producer.publish([[1], {}, {}], exchange=exchange, routing_key="k", headers=h,
                         priority=priority)
        ids.append(tid)
    return ids


def ids(taken: list[Any]) -> list[str]:
    return [t.payload["headers"]["id"] for t in taken]


def test_kombu_keeps_what_the_drainer_reaches_for(broker: Any) -> None:
    conn, channel, queue, exchange, prefix = broker
    for name in ("_q_for_pri", "priority_steps", "unacked_key", "unacked_index_key", "pool",
                 "message_to_python", "ack_emulation", "global_keyprefix"):
        assert hasattr(channel, name), f"kombu's Redis channel has no {name} any more"
    lists = BrokerLists.of(channel, [queue.name])
    assert lists is not None
    publish(conn, channel, exchange, 1)
    # A message the consumer is delivered: kombu's QoS.append writes what take writes.
    got: list[Any] = []
    with conn.Consumer(queue, channel=channel, callbacks=[lambda body, m: got.append(m)]):
        channel.basic_qos(0, 10, False)
        conn.drain_events(timeout=5)
    kombu_value = loads(lists.client.hget(lists.keys[0], got[0].delivery_tag))
    assert lists.client.zscore(lists.keys[1], got[0].delivery_tag) is not None
    publish(conn, channel, exchange, 1)
    (taken,) = lists.take(["api"], 10, PLAIN)
    ours = loads(lists.client.hget(lists.keys[0], taken.tag))
    assert [type(v) for v in ours] == [type(v) for v in kombu_value] == [dict, str, str]
    assert ours[0] == taken.payload and ours[1:] == kombu_value[1:]
    assert set(ours[0]) == set(kombu_value[0])
    got[0].ack()
    lists.ack([taken])


def test_take_stops_each_list_where_the_consumer_must_decide(broker: Any) -> None:
    conn, channel, queue, exchange, _ = broker
    lists = BrokerLists(channel, [queue.name])
    first = publish(conn, channel, exchange, 3)
    publish(conn, channel, exchange, 1, flow=None)  # a plain task
    publish(conn, channel, exchange, 2)
    assert ids(lists.take(["api"], 10, PLAIN)) == first, "the oldest first, up to the plain task"
    assert lists.take(["api"], 10, PLAIN) == [], "a plain task at the tail: nothing taken"
    assert channel._size(queue.name) == 3


@pytest.mark.parametrize("headers", [
    {"eta": "2030-01-01T00:00:00+00:00"}, {"expires": "2030-01-01T00:00:00+00:00"},
    {"flow_queue": "other"}, {"flow_unique": True}, {"flow_acquire": {"x": {"deadline": 1}}},
    {"flow_woken": {"row": 1, "wake": 1}}, {"redelivered": True}])
def test_take_leaves_what_the_drainer_does_not_handle(broker: Any, headers: dict[str, Any]) -> None:
    conn, channel, queue, exchange, _ = broker
    lists = BrokerLists(channel, [queue.name])
    first = publish(conn, channel, exchange, 2)
    publish(conn, channel, exchange, 1, **headers)
    publish(conn, channel, exchange, 1)
    assert ids(lists.take(["api"], 10, PLAIN)) == first
    assert lists.take(["api", "x"], 10, PLAIN) == []


def test_take_reads_the_lists_in_the_consumers_priority_order_and_stops_at_most(broker: Any) -> None:
    conn, channel, queue, exchange, _ = broker
    lists = BrokerLists(channel, [queue.name])
    low = publish(conn, channel, exchange, 2, priority=9)
    high = publish(conn, channel, exchange, 2, priority=0)
    mid = publish(conn, channel, exchange, 2, priority=5)
    assert ids(lists.take(["api"], 5, PLAIN)) == high + mid + low[:1]
    assert ids(lists.take(["api"], 5, PLAIN)) == low[1:]


def test_give_back_puts_messages_next_for_the_consumer_and_out_of_unacked(broker: Any) -> None:
    conn, channel, queue, exchange, _ = broker
    lists = BrokerLists(channel, [queue.name])
    sent = publish(conn, channel, exchange, 4)
    taken = lists.take(["api"], 3, PLAIN)
    assert lists.client.hlen(lists.keys[0]) == 3 and lists.client.zcard(lists.keys[1]) == 3
    (newest,) = publish(conn, channel, exchange, 1)
    assert lists.give_back(taken[1:]) == 2
    assert lists.client.hlen(lists.keys[0]) == 1 and lists.client.zcard(lists.keys[1]) == 1
    assert lists.give_back(taken[1:]) == 0, "given back once: never twice"
    got = [channel._get(queue.name)["headers"]["id"] for _ in range(4)]
    assert got == [*sent[1:], newest], "the ones given back are the next, oldest first"
    lists.ack(taken[:1])
    assert lists.client.hlen(lists.keys[0]) == 0 and lists.client.zcard(lists.keys[1]) == 0


def test_what_is_never_acked_comes_back_by_kombus_own_restore(broker: Any) -> None:
    conn, channel, queue, exchange, _ = broker
    lists = BrokerLists(channel, [queue.name])
    sent = publish(conn, channel, exchange, 3)
    taken = lists.take(["api"], 10, PLAIN)
    assert len(taken) == 3 and channel._size(queue.name) == 0
    lists.ack(taken[:1])
    time.sleep(1.2)  # past the visibility timeout
    channel.qos.restore_visible(num=10, interval=1)
    back = sorted(channel._get(queue.name)["headers"]["id"] for _ in range(2))
    assert back == sorted(sent[1:]), "the two never acked, back in the queue; the acked one not"
    assert lists.client.hlen(lists.keys[0]) == 0
    assert lists.give_back(taken[1:]) == 0, "restored by kombu already: not pushed twice"
    assert channel._size(queue.name) == 0
