"""Twins: two first deliveries of one wake, of which one is decided and the other acked unrun.

A wake publishes a parked row's message once, but a publish is at-least-once: a confirmed
publish on RabbitMQ whose confirm does not come back is published again by kombu's retry
(and a push to Redis whose reply is lost, likewise), so the broker may hold two copies of one
wake, neither of them redelivered. Both name the same wake in their ``flow_woken`` header (the
row and its claim, message.py). Decided each as a fresh message, the second would run the task
again: it waits while the first runs (the gate's "delivered again" wait) and is then admitted,
or parked as a row of its own that wakes and runs later. Worse for a retried task: by then its
next attempt is on its way, and that later attempt, denied, meets the stale row of the earlier
one and is taken for a redelivery of what is parked (park.py), so the retry is lost while the
earlier attempt runs twice.

So the gate remembers, per worker, the wakes whose copy it took (:meth:`Twins.twin`), by the
copy's ticket and its wake, with the delivery that brought it; another first delivery of the
same wake is its twin and is acked unrun. The copy taken stays the one to decide: it is unacked
until it runs or its own row is committed, and if its channel drops it is redelivered (a
redelivery is judged by park.py, never here). A twin delivered to another worker of the fleet
is not known here; the wakes are forgotten after :data:`KEEP` seconds, and at most :data:`MOST`
are kept.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..protocol import ticket_id
from .message import woken_from

__all__ = ["KEEP", "MOST", "Twins"]

#: Seconds a wake taken here is remembered (far longer than a duplicate publish takes).
KEEP = 600.0
#: Wakes remembered at most (the oldest go first).
MOST = 100_000


class Twins:
    """The wakes whose copy one worker took (module docstring). Used on the consumer's loop."""

    def __init__(self, keep: float = KEEP, most: int = MOST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.most = most
        self.clock = clock
        self.acked = 0  # twins acked unrun
        self._taken: OrderedDict[tuple[str, int, int], tuple[Any, float]] = OrderedDict()

    def twin(self, message: Any, headers: dict[str, Any]) -> bool:
        """True if *message* is a first delivery of a wake whose copy another delivery brought
        here; else False, and a woken one's wake is remembered as taken by it. A redelivery,
        or a message no waker published, is never a twin."""
        wake = woken_from(headers)
        if wake is None or (message.delivery_info or {}).get("redelivered"):
            return False
        key = (ticket_id(headers), *wake)
        now = self.clock()
        taken = self._taken.get(key)
        if taken is not None and now - taken[1] < self.keep:
            return taken[0] != message.delivery_tag
        self._taken[key] = (message.delivery_tag, now)
        self._taken.move_to_end(key)
        while self._taken and (len(self._taken) > self.most
                               or now - next(iter(self._taken.values()))[1] >= self.keep):
            self._taken.popitem(last=False)
        return False
