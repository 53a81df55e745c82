"""Admission asked early: sent before kombu's own round trip for the message.

Features
    On the Redis broker a message delivered with ``task_acks_late`` is first recorded as
    unacked, one blocking round trip to Redis (kombu's ``QoS.append``), and only then handed
    to Celery and to the strategy. The gate sends the message's admission call just before
    that round trip, on its own connection (admission/redis/loop.py): the two travel side by side,
    and by the time the strategy asks, the reply is usually in. The strategy then decides at
    once, in the same turn of the consumer's loop: no wait, and no turn of the loop for the
    reply alone. When the reply is not in yet, it comes on the loop as any other.

    The call is the one the strategy would make (same ticket, script and reply), for the
    messages the strategy asks for on the loop: a FlowTask's fresh delivery with a flow
    queue, no ``acquire_slot`` slots and no future ETA, whose ticket this worker is not
    already running or asking for. Other messages are asked for by the strategy itself.

    Only in a *quiet* queue (its last admission here found no waiter at all,
    admission/redis/loop.py): there admission takes the script's fast path, which costs Redis
    little. Where a line forms, a denial (joining the line, parking, lingering) costs Redis far
    more, and sent ahead it would make kombu's round trip wait for it; the hand-overs of a
    moving line are asked for by the strategy itself.

A message that never asks
    A message asked for early that does not reach the strategy's admission (revoked: Celery
    discards it) leaves its reply to nobody. That reply is undone: an admitted slot is
    released, a place in line withdrawn; unless this worker holds the same ticket another
    way meanwhile (admission is idempotent by ticket: such a copy shares that slot).

Where
    The task consumer's channel on kombu's virtual transports (Redis) while the gate's calls
    are on the loop: the hook is an attribute of that channel's QoS object, set on every
    consumer start. The AMQP transport has no such round trip to hide behind, and no hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from kombu.transport.virtual import Channel as VirtualChannel

from ..admission.base import Ticket
from ..protocol import FlowOptions
from ..task import FlowTask

logger = logging.getLogger(__name__)

#: ``Early.result`` while the reply is not in.
PENDING: Any = object()


class Early:
    """One message's admission call, sent early: what it asked, and its reply or its taker."""

    __slots__ = ("opts", "ticket", "result", "then")

    def __init__(self, opts: FlowOptions, ticket: Ticket) -> None:
        self.opts = opts
        self.ticket = ticket
        self.result: Any = PENDING  # the reply once in, while nobody waits on it
        self.then: Callable[[Any], None] | None = None  # who takes a reply still to come


class AsksEarly(Protocol):
    """The part that sends a message's admission call early (asking.py's ``LoopAsks``)."""

    def ask_early(self, message: Any, task: Any) -> None:
        ...


def hook(consumer: Any, asks: AsksEarly) -> Callable[[], None] | None:
    """Call ``asks.ask_early(message, task)`` for every FlowTask message of *consumer*'s task channel
    just before kombu records it as unacked. Returns what takes the hook off, or ``None``
    where there is nothing to hook (not a virtual transport)."""

    channel = getattr(getattr(consumer, "task_consumer", None), "channel", None)
    if not isinstance(channel, VirtualChannel):
        return None
    qos = channel.qos
    append = qos.append
    tasks = consumer.app.tasks
    strategy = FlowTask.Strategy

    def append_early(message: Any, delivery_tag: Any) -> Any:
        task = tasks.get((message.headers or {}).get("task"))
        if task is not None and getattr(task, "Strategy", None) == strategy:
            try:
                asks.ask_early(message, task)
            except Exception:  # the strategy asks as usual
                logger.exception("flowcontrol: asking early for a message failed")
        return append(message, delivery_tag)

    qos.append = append_early

    def unhook() -> None:
        if qos.__dict__.get("append") is append_early:
            del qos.append

    return unhook
