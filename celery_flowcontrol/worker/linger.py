"""Lingering waiters: denied messages kept unacked in the worker's prefetch window, briefly.

Parking a waiter and waking it costs a durable SQL commit, a claim, a delete, a republish and a
second delivery, most of it on the path from a slot's release to the next task's start. When
the grant is due soon, a denied message can instead stay where it already is: delivered to
this worker, unacked. It is in the backend's line like any waiter (its ticket was denied, and
names this instance), so the grant goes to it in line order; its announcement (or the release
that this very worker made) hands it back to the consumer's loop, which asks admission again:
the grant is confirmed and the message runs, without SQL or broker.

Bounds, so that lingering costs no more than a second prefetch window, and never blocks one:

* only while its queue's line moves: a grant of that queue was announced (to any worker),
  or a task of it admitted here, within the last ``flowcontrol_linger`` seconds. A stalled
  line parks every waiter at once, so nothing waits in worker memory for a slot
  that is not coming;
* at most as many at once as the consumer's prefetch window holds. In a FIFO queue (one
  priority, no fairness keys: the broker's order is already the backend's), each one takes a
  window place, as a prefetched message does: while the window is full of waiters, fresh
  messages stay in the broker, cheaply, instead of being fetched only to be parked;
* in an **ordered** queue (``fairness="key"``, ``order="lifo"``, ``per_key_concurrency``, or
  one in which this worker saw a ``flow_priority`` within :data:`PRIORITY_MEMORY`), the
  broker's order is not the backend's, so the backlog must not wait in the broker behind the
  window: each lingering waiter **raises the window by one** while it lingers (the consumer's
  QoS, as Celery does for a message waiting for its ETA), the consumer keeps taking the next
  messages, and one denied while every lingering place is taken is parked at once. Under a
  flood the backlog drains out of the broker into the parking table, where it costs no worker
  memory and stands in the backend's line with its priority and key: the backend orders all
  of it, not only what a window happens to hold (docs/worker.md, "A flood");
* when every lingering place is taken, a concurrency denial of a higher ``flow_priority``
  takes the place of the lowest of its queue's lingering waiters below it, which is asked again
  (and parks): the head of the line is the one whose grant must find it in memory, not in the
  parking table behind a SQL claim and a second delivery;
* it waits at most ``flowcontrol_linger`` seconds; then it is asked again and, if still
  denied, parked (committed, then acked) as any other waiter;
* a grant can come before its waiter lingers: the denial is made in the backend, and a release
  (another worker's, or this one's on another connection) grants it the freed slot while the
  denial's reply is still on its way to this loop. Such a grant is kept for the linger bound,
  and the message it names is resumed at once when it comes to linger, not left to wait out
  the bound with its slot held for it (every other waiter's turn would pass it meanwhile);
* a plain concurrency denial lingers, and a rate limit's whose turn comes within the bound
  (asked again at that instant: a paced line has no grant to wait for, and parking the last
  steps of its approach would cost a SQL commit and a republish each, in front of every fresh
  message); so does a message whose ETA comes within the bound (a short countdown, or a parked
  row woken ahead of its instant, waking.py), asked at its ETA; longer rate waits and ETAs,
  backoffs and ``acquire_slot`` park.

Guarantees kept: nothing is acked before it runs or its row is committed (a crash redelivers
a lingering message, which keeps its ticket and so its place in line, or confirms its grant); a
lingering message runs only through admission (the cap is exact); its order is the backend's line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..admission.base import CONCURRENCY

logger = logging.getLogger(__name__)

#: Seconds a queue counts as ordered after this worker last saw a ``flow_priority`` on it.
PRIORITY_MEMORY = 600.0
#: Grants kept for waiters not lingering yet before the old ones are looked through.
EARLY_KEPT = 256


def ordered(config: Any) -> bool:
    """True if the backend may order *config*'s waiters other than the broker delivers them."""
    return config is not None and (config.fairness == "key" or config.order == "lifo"
                                   or config.per_key_concurrency is not None)


@dataclass
class _Lingerer:
    queue: str
    resume: Callable[[], Any]
    generation: int
    timer: Any = None
    qos: Any = None  # the QoS raised for it, given back when it resumes
    priority: int = 0  # its flow_priority: a higher one may take its place (module docstring)


class Handed(Protocol):
    """Told of a queue whose lingering waiter was handed its grant (the wake-ahead policy,
    wake_ahead.py: the waker brings the next parked waiters of that queue closer)."""

    def handed(self, queue: str, n: int = 1) -> None:
        """A lingering waiter of *queue* got its grant (called on the consumer's loop)."""


class Lingering:
    """The lingering waiters of one worker instance, by ticket id (the task id, but for a retry).
    ``grant`` may be called from any thread; everything else runs on the consumer's loop (the
    hub's thread)."""

    def __init__(self, seconds: float, ahead: Handed | None = None) -> None:
        self.seconds = float(seconds)
        self.limit = 0
        self.lingered = 0  # messages that ever lingered
        self.handed = 0    # of them, resumed by their grant (the rest by the bound)
        self._hub: Any = None
        self._timer: Any = None
        self._qos: Any = None  # the consumer's kombu QoS: one more window place per lingerer
        self._entries: dict[str, _Lingerer] = {}
        self._generation = 0  # one per attach: a resume queued before a detach is dropped
        self._moving: dict[str, float] = {}  # queue -> monotonic time of its last grant
        self._arrived: dict[str, float] = {}  # task id -> when it last lingered
        self._early: dict[str, float] = {}  # task id -> when a grant came before it lingered
        self._early_cap = EARLY_KEPT
        self._prioritised: dict[str, float] = {}  # queue -> monotonic time a priority was seen
        self._lock = threading.Lock()
        #: Told (on the consumer's loop) of a queue whose lingering waiter was handed its grant.
        self.ahead = ahead

    def attach(self, hub: Any, timer: Any, limit: int, qos: Any = None) -> None:
        """Start lingering on a consumer (its event loop, its timer, its prefetch window and
        the kombu ``QoS`` that sets it). No event loop (a solo or threads pool), no window or
        no bound: nothing lingers."""
        self._hub, self._timer, self._qos = hub, timer, qos
        self._generation += 1
        self.limit = max(0, int(limit)) if hub is not None and self.seconds > 0 else 0

    def detach(self) -> None:
        """The consumer stopped (shutdown, broker reconnect): its unacked messages go back to
        the broker, so the lingering ones are forgotten (their redelivery keeps their tickets).
        Its QoS goes with it (the next consumer starts from the configured window)."""
        with self._lock:
            entries, self._entries = self._entries, {}
            self._early = {}
            self.limit = 0
            self._qos = None
        for entry in entries.values():
            if entry.timer is not None:
                entry.timer.cancel()

    def __len__(self) -> int:
        return len(self._entries)

    def room(self) -> int:
        """How many more messages may linger now."""
        return max(0, self.limit - len(self._entries))

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._entries

    def lingering(self) -> dict[str, str]:
        """Ticket id -> queue of every message lingering here now (a copy)."""
        with self._lock:
            return {t: e.queue for t, e in self._entries.items()}

    def moved(self, queue: str) -> None:
        """A grant of *queue* was announced, or a task of it admitted (any thread): its line
        moves."""
        self._moving[queue] = time.monotonic()

    def moving(self, queue: str) -> bool:
        """True if *queue*'s line moved within the linger bound (a denial there may linger)."""
        return time.monotonic() - self._moving.get(queue, float("-inf")) <= self.seconds

    def seen(self, opts: Any) -> None:
        """A message with these flow options came: one with a ``flow_priority`` makes its
        queue ordered for a while."""
        if opts.priority:
            self._prioritised[opts.queue] = time.monotonic()

    def drains(self, queue: str, config: Any) -> bool:
        """True if *queue*'s lingering waiters raise the window (an ordered queue, above)."""
        return ordered(config) or (
            time.monotonic() - self._prioritised.get(queue, float("-inf")) < PRIORITY_MEMORY)

    def may(self, reason: str, turn: float | None, queue: str = "", priority: int = 0) -> bool:
        """True if a denial for *reason* may linger, room permitting: a concurrency denial
        (until its grant or the bound), or a rate limit's (or an ETA's) whose *turn* (seconds
        from now) comes within the bound (a paced line has no grant to wait for; parked, the
        last step of its approach would cost a SQL commit and a republish in front of every
        fresh message). With no room left, none may (and the gate reads no parked row to know
        more), but a concurrency denial of *queue* whose *priority* is above one lingering there."""
        if len(self._entries) >= self.limit:
            return reason == CONCURRENCY and self._below(queue, priority) is not None
        return reason == CONCURRENCY or (turn is not None and turn <= self.seconds)

    def _below(self, queue: str, priority: int) -> str | None:
        """The lowest-priority waiter of *queue* lingering here below *priority*, if any (its
        ticket id)."""
        lowest, least = None, priority
        for task_id, e in list(self._entries.items()):  # a grant may take one meanwhile
            if e.queue == queue and e.priority < least:
                lowest, least = task_id, e.priority
        return lowest

    def add(self, task_id: str, queue: str, resume: Callable[[], Any], config: Any = None,
            turn: float | None = None, priority: int = 0) -> bool:
        """Let *task_id* linger; ``resume()`` asks admission again (and runs or parks it). In an
        ordered queue (*config*, or a priority seen) it raises the window while it lingers
        (module docstring). With *turn* (a rate-held waiter: the seconds until the limits let
        it in, at most the bound) it is asked again then, whether its line moves or not. With
        no room, one waiting for its grant takes the place of one of its queue of a lower
        *priority* (its ``flow_priority``), which is asked again now. False if there is no
        room, its queue's line has not moved lately, or it lingers already (a duplicate
        delivery parks instead)."""
        if turn is None and not self.moving(queue):
            return False
        displaced = None
        with self._lock:
            if task_id in self._entries:
                return False
            if len(self._entries) >= self.limit:
                below = self._below(queue, priority) if turn is None else None
                if below is None:
                    return False
                displaced = self._entries.pop(below)
            entry = self._entries[task_id] = _Lingerer(queue, resume, self._generation,
                                                       priority=priority)
        if displaced is not None:
            self._hub.call_soon(self._resume, displaced, False)  # asked again: it parks
        wait = self.seconds if turn is None else min(self.seconds, max(0.0, turn))
        entry.timer = self._timer.call_after(wait, self._expire, (task_id,))
        entry.qos = self._qos if self.drains(queue, config) else None
        if entry.qos is not None:
            # Its window place is given back by one more: the consumer keeps fetching. The
            # loop applies it (asynloop updates a changed QoS on every turn).
            entry.qos.increment_eventually()
        self.lingered += 1
        now = time.monotonic()
        if len(self._arrived) > 4 * self.limit:  # forget what is older than the bound
            self._arrived = {t: at for t, at in self._arrived.items() if now - at < self.seconds}
        self._arrived[task_id] = now
        with self._lock:
            early = self._early.pop(task_id, None)
        if early is not None and now - early < self.seconds:
            self.grant(task_id)  # its grant came first: resumed now, into the slot kept for it
        return True

    def arrived(self, task_id: str) -> bool:
        """True if *task_id* lingered here within the linger bound (any thread)."""
        return time.monotonic() - self._arrived.get(task_id, float("-inf")) < self.seconds

    def grant(self, task_id: str) -> bool:
        """A grant for *task_id* (any thread): resume it on the consumer's loop if it lingers here."""
        with self._lock:
            entry = self._entries.pop(task_id, None)
            if entry is None:
                if self.limit:
                    self._keep_early(task_id)
                return False
        self.handed += 1
        self._hub.call_soon(self._resume, entry, True)
        return True

    def _keep_early(self, task_id: str) -> None:
        """Keep a grant for *task_id*, not lingering here (yet), for the linger bound (under
        the lock). Most are grants of waiters parked or lingering elsewhere, never asked for
        here: those past the bound are dropped whenever the memory doubles."""
        now = time.monotonic()
        self._early[task_id] = now
        if len(self._early) > self._early_cap:
            self._early = {t: at for t, at in self._early.items() if now - at < self.seconds}
            self._early_cap = max(EARLY_KEPT, 2 * len(self._early))

    def _expire(self, task_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(task_id, None)
        if entry is not None:
            self._resume(entry, False)

    def _resume(self, entry: _Lingerer, granted: bool) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.qos is not None and entry.qos is self._qos:
            entry.qos.decrement_eventually()  # runs or parks now: an ordinary window place
        if entry.generation != self._generation or self.limit == 0:
            return  # its consumer stopped since: the broker has the message back
        try:
            entry.resume()
        except Exception:  # the consumer's loop must not die of one message
            logger.exception("flowcontrol: a lingering message failed to resume")
        if granted and self.ahead is not None:
            self.ahead.handed(entry.queue)
