"""The waker: a worker's background thread that brings parked messages back.

It republishes a parked message (same task id, body, headers, properties and routing) when
a slot is granted to it (announced by the admission backend, handled at once) or when its
``wake_at`` is due, and it does the periodic chores that must not block the consumer's event
loop: the instance heartbeat, the reclaim pass, grants whose announcement was missed,
releases that failed during an outage, and forgetting old woken rows (chores.py).

A row this worker knows (it parked it, or claimed it and gave it back) is claimed by id when due,
the thread sleeping until the earliest (waking.py); every due row, by the poll, each tick of
the consumer's timer. While a service is unreachable, due rows wait for the poll (woken, they
would only wait unacked in a worker for the outage to end).

Claim, publish, then delete (republish.py): a crash between publish and delete republishes
a row again (at-least-once, as Celery itself) rather than losing it.

A grant is announced to every worker, but only the instance named in it (the one that parked
the waiter) wakes it at once: the others would only lose the race for its row, each paying a
write transaction that SQLite serialises with every park. A grant naming nobody (a backend that
does not say) is woken by every instance; one whose instance died is woken by the pending-grant
rescue of any survivor that asks admission in its queue (else at its row's ``wake_at``, when it
asks again and finds its grant). Grants that queue up while the waker is busy are woken
together: one claim transaction, one publish each, one delete transaction.

A grant for a waiter lingering in this worker (linger.py) is handed to it directly. And when a grant
is handed over in a queue (directly, or through its parked row), the next parked waiters of
that queue are woken ahead of their grant, as many as the worker has room for: they come
back, are denied again (a waiter keeps its place in line) and linger, so that their own grants
find them in memory. That keeps the SQL and broker round trips off the path from a release
to the next start while the queue is busy; when nothing moves, nothing is woken early.
Only waiters parked for a slot are woken ahead: one a rate limit holds comes back at its turn
(the backend paces a rate-held line, one turn per waiter ahead), and woken early it would only
be parked again, a round trip through SQL and the broker in front of every fresh message. A
queue whose next rows were all rate-held is not woken ahead for :data:`EMPTY_RECHECK`.
A queue found with no parked row is not looked at again for :data:`EMPTY_RECHECK`, unless
this worker parks a row meanwhile: in a busy line whose waiters all linger, hand-overs
come hundreds of times a second, and each would otherwise cost a count in SQL and a turn of
this thread, on the GIL the consumer's loop needs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..admission.base import AdmissionBackend, Grant
from ..errors import FlowControlError, UnknownQueueError
from ..parking import ParkedMessage, ParkingStore
from ..protocol import task_id_of
from ..reasons import FOR_A_SLOT
from .chores import Chores
from .crashpoints import crashpoint
from .holdings import Holdings
from .linger import Lingering
from .republish import republish, wake_due
from .waking import DUE, BatchChores, WakeTimes

logger = logging.getLogger(__name__)

#: A grant whose row was not parked yet is remembered this long, for the parker to find.
ORPHAN_TTL = 30.0
#: How far past the waiters it wants the waker looks down a line for parked ones to wake
#: ahead of their grant (the head of a busy line lingers in some worker already).
AHEAD_SCAN = 16
#: The parking reasons of waiters woken ahead: those that linger once back (linger.py).
LINGERS = FOR_A_SLOT
#: How long a queue found with no parked row is not counted again for wake-ahead (unless
#: this worker parks one meanwhile): a row another worker parks waits at most this much
#: longer to be woken ahead of its grant; its grant still wakes it at once.
EMPTY_RECHECK = 0.5
_TICK = object()


class _Prewake(tuple):  # (queue, n): wake n next waiters of a queue ahead of their grant
    pass


class Waker(threading.Thread):
    """Wakes parked messages; one per worker instance. Feed it with :meth:`on_grant`."""

    def __init__(self, *, app: Any, backend: AdmissionBackend, store: ParkingStore,
                 instance: str, heartbeat_every: float, reclaim_every: float,
                 clock: Callable[[], float] = time.time, lingering: Lingering | None = None,
                 reassert: Callable[[], object] | None = None,
                 holdings: Holdings | None = None) -> None:
        super().__init__(name="flowcontrol-waker", daemon=True)
        self.app = app
        self.backend = backend
        self.store = store
        self.instance = instance
        self.clock = clock
        self.woken = 0
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._halt = threading.Event()
        self._lock = threading.Lock()  # orders a grant's claim against a park's commit
        self._orphans: dict[str, float] = {}
        self._outage = False
        #: Waiters lingering in this worker's prefetch window (linger.py).
        self.lingering = lingering
        self._ahead: dict[str, dict[str, float]] = {}  # queue -> task id -> woken ahead at
        self._empty: dict[str, float] = {}  # queue -> when it was counted with no row
        self._paced: dict[str, float] = {}  # queue -> when its next rows were all rate-held
        self._parked_at = 0.0  # when this worker last parked a row (monotonic)
        self.due = WakeTimes()  # when the rows this worker knows come due
        #: The periodic chores, at each tick (chores.py).
        self.chores = Chores(app=app, backend=backend, store=store, instance=instance,
                             heartbeat_every=heartbeat_every, reclaim_every=reclaim_every,
                             coming=BatchChores(self.due), reassert=reassert, holdings=holdings)

    # -- feeding ----------------------------------------------------------------------------
    def on_grant(self, grant: Grant) -> None:
        """Grant callback (any thread): wake the granted waiter at once, if it is ours."""
        if self.lingering is not None:
            self.lingering.moved(grant.queue)
            if self.lingering.grant(grant.task_id):
                return  # lingering here: resumed on the consumer's loop, no SQL, no broker
        if grant.instance is None or grant.instance == self.instance:
            self._inbox.put(grant)

    def prewake(self, queue: str, n: int = 1) -> None:
        """A lingering waiter of *queue* got its grant (any thread): wake the next *n* parked
        waiters ahead of theirs, so the worker keeps as many lingering as it did."""
        empty = self._empty.get(queue)
        if empty is not None and empty > self._parked_at and \
                time.monotonic() - empty < EMPTY_RECHECK:
            return  # none parked a moment ago, and none parked here since
        if time.monotonic() - self._paced.get(queue, float("-inf")) < EMPTY_RECHECK:
            return  # its next waiters wait for rate limits a moment ago: nothing to linger
        self._inbox.put(_Prewake((queue, n)))

    def tick(self) -> None:
        """Timer callback (the consumer's loop): run the periodic chores soon."""
        self._inbox.put(_TICK)

    def retry_release(self, slot_id: str) -> None:
        """A release failed (backend outage): try it again on each tick until it lands."""
        self.chores.retry_release(slot_id)

    def parked(self, row: ParkedMessage | str) -> None:
        """The parker committed *row* (or a task id): woken now if its grant came first, else
        when it is due (waking.py), or at its grant."""
        self._parked_at = time.monotonic()
        task_id = row if isinstance(row, str) else row.task_id
        with self._lock:
            hit = self._orphans.pop(task_id, None) is not None
        if hit:
            self._inbox.put(task_id)
        elif not isinstance(row, str) and self.due.remember([row], self.lingering):
            self._inbox.put(DUE)  # the thread may sleep past it: it looks again

    def stop(self, timeout: float = 5.0) -> None:
        self._halt.set()
        self._inbox.put(None)
        if self.is_alive():
            self.join(timeout)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.is_set():
            items = [self.due.take(self._inbox, self.clock(), self._outage)]
            while True:  # whatever queued meanwhile is handled in the same round
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            grants = [i for i in items if isinstance(i, Grant)]
            granted = [task_id_of(g.task_id) for g in grants]
            committed = [i for i in items if isinstance(i, str)]
            if granted:
                crashpoint("grant.announced")
                self._attempt(self.wake_many, granted, True)  # rescued after an outage (chores)
            if committed:
                self._attempt(self.wake_many, committed)
            # After a grant went through a parked row: as many as there is room for.
            ahead = {g.queue: None for g in grants}
            for i in items:
                if isinstance(i, _Prewake) and (i[0] not in ahead or ahead[i[0]] is not None):
                    ahead[i[0]] = (ahead.get(i[0]) or 0) + i[1]
            for name, n in ahead.items():
                self._attempt(self.wake_ahead, name, n)
            if any(i is _TICK for i in items):
                self._attempt(self._chores)
            if not self._outage and self.due.due(self.clock()):
                self._attempt(self.wake_known)

    def _attempt(self, step: Callable[..., Any], *args: Any) -> None:
        """Run one step of a round; log an outage once, and survive a bug."""
        try:
            step(*args)
            if self._outage:
                logger.warning("flowcontrol: parking and admission are reachable again")
                self._outage = False
        except FlowControlError as exc:
            if not self._outage:
                logger.error("flowcontrol: waker can't reach a service (%s); retrying", exc)
                self._outage = True
        except Exception:  # the thread must survive a bug in one wake
            logger.exception("flowcontrol: waker failed in %s%r", step.__name__, args)

    def _chores(self) -> None:
        now = self.clock()
        chores = self.chores
        chores.heartbeat(now)
        with self._lock:
            stale = [t for t, at in self._orphans.items() if now - at > ORPHAN_TTL]
            for t in stale:
                del self._orphans[t]
        chores.release_failed()
        rescue = chores.sweep(now)
        if rescue:
            self.wake_many(rescue)
        self.wake_due()
        chores.batches_coming(now)  # batches producers parked

    # -- waking -----------------------------------------------------------------------------
    def wake_many(self, task_ids: list[str], remember: bool = False) -> int:
        """Republish the parked messages of *task_ids* now (claimed in one transaction);
        how many. With *remember*, an id not parked yet is woken when its park commits."""
        with self._lock:
            messages = self.store.claim_many(task_ids)
            if remember and len(messages) < len(task_ids):
                found = {m.task_id for m in messages}
                at = self.clock()
                for task_id in task_ids:
                    if task_id not in found:
                        self._orphans[task_id] = at
        if messages:
            self._republish(messages)
        return len(messages)

    def wake_ahead(self, queue: str, n: int | None = None) -> int:
        """Republish the next parked waiters of *queue*: *n*, or as many as this worker has
        room for, but never more than that room (see the module docstring); how many."""
        lingering = self.lingering
        if lingering is None:
            return 0
        # Those woken ahead and not back yet count against the room (until the linger bound
        # passes): without it a slow fleet would wake more than can linger, and park the
        # rest again.
        now = time.monotonic()
        recent = {t: at for t, at in self._ahead.get(queue, {}).items()
                  if now - at < lingering.seconds and not lingering.arrived(t)}
        room = lingering.room() - len(recent)
        n = room if n is None else min(n, room)
        if n > 0:
            counted = time.monotonic()
            if self.store.count(queue) == 0:
                if len(self._empty) >= 64:  # flow_group queues come and go: keep only fresh ones
                    self._empty = {q: t for q, t in self._empty.items()
                                   if counted - t < EMPTY_RECHECK}
                self._empty[queue] = counted
                n = 0
            else:
                self._empty.pop(queue, None)
        if n <= 0:
            self._remember_ahead(queue, recent)
            return 0
        # "Next" in the backend's line: the table's order drifts from it (a waiter woken by
        # its retry tick and parked again gets a new seq). Those lingering here or elsewhere, or
        # on their way, have no row to claim and are passed over.
        try:
            waiters = self.backend.waiters(queue, n + AHEAD_SCAN)
        except UnknownQueueError:
            return 0  # a flow_group's queue, gone with its group
        line = [task_id_of(w.task_id) for w in waiters if w.task_id not in lingering]
        with self._lock:
            claimed = {m.task_id: m for m in self.store.claim_many(line)}
        ordered = [claimed[t] for t in dict.fromkeys(line) if t in claimed]
        # Only a waiter parked for a slot would linger once back: one a rate limit holds
        # comes back at its turn (its wake_at), and woken now it would only be parked again.
        chosen = [m for m in ordered if m.reason in LINGERS][:n]
        spare = [m for m in ordered if m not in chosen]
        if ordered and not chosen:
            self._paced[queue] = time.monotonic()
        if spare:
            self.store.unclaim([m.task_id for m in spare])
            self.due.remember(spare, self.lingering)  # given back: known here from now on
        self._remember_ahead(queue, recent | {m.task_id: now for m in chosen})
        if chosen:
            self._republish(chosen)
        return len(chosen)

    def _remember_ahead(self, queue: str, woken: dict[str, float]) -> None:
        """Keep *queue*'s woken-ahead waiters, and no entry for a queue with none (a
        flow_group's queue is gone with its group)."""
        if woken:
            self._ahead[queue] = woken
        else:
            self._ahead.pop(queue, None)

    def wake_due(self) -> int:
        """Republish every parked message whose time has come; how many."""
        n = wake_due(self.app, self.store, self.clock, backend=self.backend)
        self.woken += n
        return n

    def wake_known(self) -> int:
        """Republish the rows known here that come due now (waking.py); how many."""
        now = self.clock()
        with self._lock:
            claimed = self.store.claim_many(self.due.claiming(now))
        ready, later = self.due.sort(claimed, now, self.lingering)
        if later:
            self.store.unclaim([m.task_id for m in later])
        if ready:
            self._republish(ready)
        return len(ready)

    def _republish(self, messages: list[ParkedMessage]) -> None:
        self.woken += republish(self.app, self.store, messages, self.clock, self.backend)
