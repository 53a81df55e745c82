"""The one owner of kombu's Redis transport internals: its lists, its unacked hash and index.

kombu's Redis transport emulates a broker's delivery and ack with keys of its own: a queue is
one Redis list per priority step (``channel._q_for_pri(queue, step)`` for each of
``channel.priority_steps``, read by one ``BRPOP`` in that order; kombu pushes on the left, so
the tail is the oldest), and a message delivered but not acked is kept in the channel's
unacked hash (``channel.unacked_key``: delivery tag -> json ``[payload, exchange, routing
key]``) and its index (``unacked_index_key``: delivery tag by the time it was delivered).
``QoS.restore_visible`` (run by every consumer of the broker) puts back on its list whatever
the index holds longer than the visibility timeout: so a message a dead node held comes back.
kombu gives no public way to any of it; everything of flow control that reaches for it is here,
and ``tests/integration/test_kombu_redis.py`` fails by name when a kombu release changes it.

``publish_first(producer, ...)``, ``pushes_first(producer)``
    On kombu's Redis transport, a message pushed onto the end of its queue's list that the
    consumer pops next (``RPUSH``: where kombu itself puts back a message a consumer restores),
    instead of ``Producer.publish``'s ``LPUSH`` behind every message waiting. kombu has no
    public way to publish at the head; this prepares the message as ``Producer.publish`` does
    (``prepare_message``, the channel's ``_inplace_augment_message``), routes it with
    ``_lookup`` and picks the list of its priority step with ``_q_for_pri``.
``ack_together(messages)``, ``AckTogether``
    Ack several messages of one channel in one round trip. kombu's Redis transport emulates an
    ack with a Redis pipeline of its own per message (``QoS.ack``: ZREM from the unacked index,
    HDEL from the unacked hash, a blocking round trip each), and has no ack of several
    (``basic_ack``'s ``multiple`` is ignored). ``AckTogether.send`` sends their commands in one
    pipeline (any thread: the channel's pool is thread-safe); ``record``, on the consumer's
    thread, does what ``QoS.ack`` and ``Message.ack`` do after their round trip: the virtual
    QoS's bookkeeping (public), and the message's ``_state`` (kombu's own, private).
``BrokerLists``
    A consumer's lists, taken from in bulk beside the consumer (worker/drain.py): ``take``
    (``lua/drain_take.lua``) pops the oldest messages of given flow queues and records each in
    the unacked hash and index exactly as ``QoS.append`` does, so a node that dies holding them
    gets them back by kombu's own visibility restore; ``give_back``
    (``lua/drain_give_back.lua``) puts messages back at the tail of their list, the next the
    consumer takes; ``ack`` is ``QoS.ack``'s ZREM and HDEL, for many in one round trip. None of
    it goes through the channel's QoS (these messages were never delivered to the consumer),
    and any thread may call it: the channel's connection pool is thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kombu.entity import maybe_delivery_mode
from kombu.utils.json import dumps, loads

from .lua_loader import compose
from .protocol import QUEUE_HEADER

__all__ = ["AckTogether", "BrokerLists", "Taken", "ack_together", "publish_first", "pushes_first"]


def pushes_first(producer: Any) -> bool:
    """True when :func:`publish_first` can publish at the head on *producer*'s channel:
    kombu's Redis transport, with the channel methods it uses."""
    channel = producer.channel
    return getattr(producer.connection.transport, "driver_type", "") == "redis" and all(
        hasattr(channel, name) for name in ("_q_for_pri", "_lookup", "_inplace_augment_message"))


def publish_first(producer: Any, body: bytes, *, exchange: str, routing_key: str,
                  headers: dict[str, Any], content_type: str, content_encoding: str,
                  properties: dict[str, Any]) -> bool:
    """Publish *body* at the head of its queue on kombu's Redis transport (served before every
    message of its priority step that waits there); ``False``, with nothing sent, on any other
    transport or for an exchange that is not routed to lists (fanout: pub/sub). *properties*
    as ``Producer.publish`` takes them (``priority``, ``expiration`` in seconds...)."""
    channel = producer.channel
    if not pushes_first(producer):
        return False
    if exchange and channel.typeof(exchange).type not in ("direct", "topic"):
        return False
    props = dict(properties)
    priority = props.pop("priority", None)
    expiration = props.pop("expiration", None)
    if expiration is not None:
        props["expiration"] = str(int(expiration * 1000))  # as Producer.publish writes it
    props["delivery_mode"] = maybe_delivery_mode(props.get("delivery_mode"))

    def push() -> None:
        ch = producer.channel  # a revived one after a reconnect
        message = ch.prepare_message(body, priority, content_type, content_encoding,
                                     dict(headers), dict(props))
        ch._inplace_augment_message(message, exchange, routing_key)
        step = ch._get_message_priority(message, reverse=False)
        expires = getattr(ch, "_expires", None) or {}
        with ch.conn_or_acquire() as client:
            for queue in ch._lookup(exchange, routing_key):
                client.rpush(ch._q_for_pri(queue, step), dumps(message))
                if queue in expires:
                    client.pexpire(ch._q_for_pri(queue, step), expires[queue])

    producer.connection.ensure(producer, push, max_retries=3)()
    return True


def ack_together(messages: list[Any]) -> bool:
    """Ack *messages* in one round trip where kombu's Redis transport would make one each: True
    once done. False, with nothing done, where that is not so (another transport, messages of
    several channels, one acked already or of a no-ack consumer): ack them one by one. Raises
    what the pipeline raises (the connection's errors), the messages still unacked then."""
    together = AckTogether.of(messages)
    if together is not None:
        together.send(messages)
        together.record(messages)
    return together is not None or not messages


class AckTogether:
    """The acks of messages of one kombu Redis channel in one round trip (module docstring)."""

    def __init__(self, channel: Any, qos: Any) -> None:
        self.channel, self.qos = channel, qos  # a Redis channel and its QoS

    @classmethod
    def of(cls, messages: list[Any]) -> AckTogether | None:
        """How to ack *messages* (or some) together (read on the consumer's thread), or None."""
        try:
            from kombu.transport.redis import QoS as RedisQoS
        except ImportError:  # redis-py is not installed: no Redis transport either
            return None
        channel: Any = getattr(messages[0], "channel", None) if messages else None
        qos = getattr(channel, "qos", None)
        if type(qos) is not RedisQoS or channel.no_ack_consumers or any(
                getattr(m, "channel", None) is not channel or m.acknowledged for m in messages):
            return None
        return cls(channel, qos)

    def send(self, messages: list[Any]) -> None:
        """What ``QoS.ack`` sends (its ``_remove_from_indices``) for each of *messages*, in one
        pipeline. Any thread; raises what the pipeline raises."""
        with self.channel.conn_or_acquire() as client:
            _unacked_removed(client, self.qos.unacked_key, self.qos.unacked_index_key,
                             [m.delivery_tag for m in messages])

    def record(self, messages: list[Any]) -> None:
        """After :meth:`send`, on the consumer's thread: ``QoS.ack``'s and ``Message.ack``'s."""
        from kombu.transport.virtual import QoS as VirtualQoS

        for m in messages:
            VirtualQoS.ack(self.qos, m.delivery_tag)
            m._state = "ACK"


@dataclass(frozen=True, slots=True, eq=False)
class Taken:
    """One message :meth:`BrokerLists.take` took: the list it came from, its delivery tag, and
    its payload as the broker held it (text) and decoded."""

    list: str
    tag: str
    raw: str
    payload: dict[str, Any]


class BrokerLists:
    """The lists one consumer's channel reads, taken from in bulk (module docstring). Built by
    :meth:`of` from a consumer's channel and the names of the queues it consumes."""

    def __init__(self, channel: Any, queues: Sequence[str]) -> None:
        import redis

        self.channel = channel
        # kombu's own client prefixes only the first key of an EVALSHA (its mutex script):
        # a plain client on the channel's pool, with every key named in full here.
        self.client = redis.Redis(connection_pool=channel.pool)
        prefix = getattr(channel, "global_keyprefix", None) or ""
        # The order BRPOP reads them in: each priority step, every queue within it.
        self.lists = [prefix + channel._q_for_pri(q, step) for step in channel.priority_steps
                      for q in queues]
        self.keys = (prefix + channel.unacked_key, prefix + channel.unacked_index_key)
        self._take = self.client.register_script(
            compose(__package__, "drain_take", constants={"QUEUE_HEADER": QUEUE_HEADER}))
        self._give_back = self.client.register_script(compose(__package__, "drain_give_back"))

    @classmethod
    def of(cls, channel: Any, queues: Sequence[str]) -> BrokerLists | None:
        """The lists of *channel* (a consumer's) for *queues*; None but on kombu's Redis
        transport with its ack emulation on."""
        try:
            from kombu.transport.redis import Channel as RedisChannel
        except ImportError:  # redis-py is not installed: no Redis transport either
            return None
        if not isinstance(channel, RedisChannel) or not queues or not channel.ack_emulation:
            return None
        return cls(channel, queues)

    def take(self, queues: Collection[str], most: int, allowed: Collection[str]) -> list[Taken]:
        """Up to *most* of the oldest messages of flow queues *queues*, off the tails of the
        lists, in the consumer's order; each list left at its first message of another queue,
        or one carrying a ``flow_*`` header not in *allowed*, an ETA, an expiry, or
        delivered before (``lua/drain_take.lua``). Raises what redis-py raises."""
        flat = self._take(keys=[*self.keys, *self.lists],
                          args=[repr(time.time()), most, dumps(sorted(queues)), dumps(sorted(allowed))])
        out = []
        for i in range(0, len(flat), 2):
            raw = flat[i + 1].decode() if isinstance(flat[i + 1], bytes) else flat[i + 1]
            payload = loads(raw)
            out.append(Taken(self.lists[int(flat[i]) - 1], payload["properties"]["delivery_tag"], raw, payload))
        return out

    def to_message(self, taken: Taken) -> Any:
        """*taken* as the kombu message the consumer would have made of it."""
        return self.channel.message_to_python(taken.payload)

    def give_back(self, taken: Sequence[Taken]) -> int:
        """Put *taken* (oldest first) back at the tails of their lists, out of the unacked hash,
        in one atomic step; how many went back (one kombu restored meanwhile is not pushed
        twice). Raises what redis-py raises."""
        if not taken:
            return 0
        newest = list(reversed(taken))  # the oldest pushed last: the next the consumer takes
        args = [x for t in newest for x in (t.tag, t.raw)]
        return int(self._give_back(keys=[*self.keys, *(t.list for t in newest)], args=args))

    def ack(self, taken: Sequence[Taken]) -> None:
        """What ``QoS.ack`` sends for each of *taken*, in one pipeline. Raises what redis-py
        raises."""
        _unacked_removed(self.client, *self.keys, [t.tag for t in taken])


def _unacked_removed(client: Any, unacked: str, index: str, tags: Sequence[str]) -> None:
    """``QoS.ack``'s ``_remove_from_indices`` for each of *tags*, in one pipeline."""
    pipe = client.pipeline()
    for tag in tags:
        pipe.zrem(index, tag).hdel(unacked, tag)
    pipe.execute()
