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

A grant for a waiter lingering in this worker (linger.py) is handed to it directly. And when a
grant is handed over in a queue (directly, or through its parked row), the next parked waiters
of that queue are woken ahead of their grant, as wake_ahead.py's policy says.

What reaches the waker comes as a typed work item in its inbox (wake_items.py): a grant, a
park committed after its grant, a wake-ahead, the timer's tick; its thread gathers what came
together into one round.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..admission.base import AdmissionBackend, Grant
from ..errors import FlowControlError
from ..parking import ParkedMessage, ParkingStore
from ..protocol import task_id_of
from .chores import Chores, Reasserts
from .crashpoints import crashpoint
from .holdings import Holdings
from .linger import Lingering
from .quarantine import Quarantine
from .republish import republish, wake_due
from .wake_ahead import WakeAhead
from .wake_items import DUE, STOP, TICK, Committed, Granted, Round, WorkItem, inbox
from .waking import BatchChores, WakeTimes

logger = logging.getLogger(__name__)

#: A grant whose row was not parked yet is remembered this long, for the parker to find.
ORPHAN_TTL = 30.0


class Waker(threading.Thread):
    """Wakes parked messages; one per worker instance. Feed it with :meth:`on_grant`."""

    def __init__(self, *, app: Any, backend: AdmissionBackend, store: ParkingStore,
                 instance: str, heartbeat_every: float, reclaim_every: float,
                 clock: Callable[[], float] = time.time, lingering: Lingering | None = None,
                 reassert: Reasserts | None = None,
                 holdings: Holdings | None = None, ahead: WakeAhead | None = None,
                 quarantine: Quarantine | None = None) -> None:
        super().__init__(name="flowcontrol-waker", daemon=True)
        self.app = app
        self.backend = backend
        self.store = store
        self.instance = instance
        self.clock = clock
        self.woken = 0
        #: Where a row that can't be published goes: the parker's too, in a worker (runtime.py).
        self.quarantine = quarantine if quarantine is not None else Quarantine(store, backend)
        #: The wake-ahead policy (wake_ahead.py), and the inbox it and the others fill.
        self.ahead = ahead if ahead is not None else WakeAhead(store=store, backend=backend,
                                                               inbox=inbox())
        self.inbox: queue.SimpleQueue[WorkItem] = self.ahead.inbox
        self._halt = threading.Event()
        # Orders a grant's claim against a park's commit; held for a few set operations only,
        # never across SQL: the consumer's loop takes it for each row it parks (parked).
        self._lock = threading.Lock()
        self._orphans: dict[str, float] = {}  # granted, not parked yet when claimed: task id -> when
        self._claiming: set[str] = set()  # granted task ids being claimed right now
        self._meanwhile: set[str] = set()  # of them, parked while their claim ran
        self._outage = False
        #: Waiters lingering in this worker's prefetch window (linger.py).
        self.lingering = lingering
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
            self.inbox.put(Granted(grant))

    def tick(self) -> None:
        """Timer callback (the consumer's loop): run the periodic chores soon."""
        self.inbox.put(TICK)

    def retry_release(self, slot_id: str) -> None:
        """A release failed (backend outage): try it again on each tick until it lands."""
        self.chores.retry_release(slot_id)

    def parked(self, row: ParkedMessage | str) -> None:
        """The parker committed *row* (or a task id): woken now if its grant came first, else
        when it is due (waking.py), or at its grant."""
        self.ahead.parked()
        task_id = row if isinstance(row, str) else row.task_id
        with self._lock:
            hit = self._orphans.pop(task_id, None) is not None
            if not hit and task_id in self._claiming:
                self._meanwhile.add(task_id)  # that claim may have missed it (wake_many)
        if hit:
            self.inbox.put(Committed(task_id))
        elif not isinstance(row, str) and self.due.remember([row], self.lingering):
            self.inbox.put(DUE)  # the thread may sleep past it: it looks again

    def stop(self, timeout: float = 5.0) -> None:
        self._halt.set()
        self.inbox.put(STOP)
        if self.is_alive():
            self.join(timeout)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        while not self._halt.is_set():
            r = Round()
            self.due.take(self.inbox, self.clock(), self._outage).into(r)
            while True:  # whatever queued meanwhile is handled in the same round
                try:
                    self.inbox.get_nowait().into(r)
                except queue.Empty:
                    break
            if r.grants:
                crashpoint("grant.announced")
                # rescued after an outage (chores)
                self._attempt(self.wake_many, [task_id_of(g.task_id) for g in r.grants], True)
            if r.committed:
                self._attempt(self.wake_many, r.committed)
            # After a grant went through a parked row: as many as there is room for.
            for name, n in r.ahead.items():
                self._attempt(self.wake_ahead, name, n)
            if r.chores:
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
        how many. With *remember*, an id not parked yet is woken when its park commits: the
        park finds it an orphan, or, committed while the claim ran (which may have missed it),
        it is claimed once more."""
        if not remember:
            messages = self.store.claim_many(task_ids)
        else:
            with self._lock:
                self._claiming.update(task_ids)
            try:
                messages = self.store.claim_many(task_ids)
            finally:
                with self._lock:
                    self._claiming.difference_update(task_ids)
                    meanwhile = self._meanwhile & set(task_ids)
                    self._meanwhile -= meanwhile
            found = {m.task_id for m in messages}
            at = self.clock()
            with self._lock:
                for task_id in task_ids:
                    if task_id not in found and task_id not in meanwhile:
                        self._orphans[task_id] = at
            for task_id in meanwhile - found:
                self.inbox.put(Committed(task_id))
        if messages:
            self._republish(messages)
        return len(messages)

    def wake_ahead(self, queue: str, n: int | None = None) -> int:
        """Republish the next parked waiters of *queue*: *n*, or as many as this worker has
        room for, but never more than that room (wake_ahead.py's policy); how many."""
        lingering = self.lingering
        plan = self.ahead.plan(queue, n, lingering) if lingering is not None else None
        if plan is None:
            return 0
        claimed = self.store.claim_many(plan.line)
        chosen, spare = self.ahead.choose(plan, claimed)
        if spare:
            self.store.unclaim([m.task_id for m in spare])
            self.due.remember(spare, lingering)  # given back: known here from now on
        if chosen:
            self._republish(chosen)
        return len(chosen)

    def wake_due(self) -> int:
        """Republish every parked message whose time has come; how many."""
        n = wake_due(self.app, self.store, self.clock, quarantine=self.quarantine)
        self.woken += n
        return n

    def wake_known(self) -> int:
        """Republish the rows known here that come due now (waking.py); how many."""
        now = self.clock()
        claimed = self.store.claim_many(self.due.claiming(now))
        ready, later = self.due.sort(claimed, now, self.lingering)
        if later:
            self.store.unclaim([m.task_id for m in later])
        if ready:
            self._republish(ready)
        return len(ready)

    def _republish(self, messages: list[ParkedMessage]) -> None:
        self.woken += republish(self.app, self.store, messages, self.clock,
                                quarantine=self.quarantine)
