"""Re-assertion: tell an admission backend that forgot this instance which slots it holds.

A backend forgets an instance when its state is lost (a Redis restarted without persistence)
or when the instance's lease lapsed while its tasks still ran. Its running tasks then hold
slots nobody counts, and new admissions would run past the cap until they end. So each
instance hands the slots of its ledger to :meth:`AdmissionBackend.restore` with every
heartbeat (the backend acts on the first call after it forgot the instance, and ignores the
rest), for each queue it holds slots in or asked admission in lately (holdings.py: what it
holds, not what is registered; a queue where it holds nothing now may still count slots of
it that a failover brought back, and the restore there hands the backend the true set); the
gate does the same for a queue found missing at admission. A configured queue the backend
lost while this instance held nothing there is re-created by the gate at its next admission,
and by this pass once it finds one gone: each pass reads one configured queue's config in
turn (one ``HGET`` on Redis), and a pass that finds it gone restores every configured queue.
A Redis that lost its state lost them all, so the next pass finds out; a Redis Cluster shard
that did, within about as many passes as there are shards.

A backend can also remember too much: a Redis failover to a replica that missed the last
writes brings back slots whose releases were lost. Their holder is alive, its heartbeat
keeps their lease, and nothing would ever free them: the queue would stall at its cap with
nothing running. So every :data:`STALE_EVERY`-th pass also lists the busy slots of each queue
where this instance holds slots or asked admission lately (holdings.py: a failover brings
back what was written a moment before it, while this instance was asking there) and
releases those the backend says this instance holds but its ledger does not (a task that is
not running here), once they were so at two checks in a row (an admission whose reply is on
its way is in the ledger within milliseconds). Queues with ``release="manual"`` are left out:
their slots outlive their tasks by design and end by ``release_slot`` or ``max_hold``. The
same failover brings back waiters (and grants to them) for tasks that have run since: each
would take a grant and hold its slot for ``grant_ttl`` unconfirmed, one after the other. So
the same check withdraws a waiter or grant whose ticket finished here after it joined the
line or was granted (the ledger remembers the last finished tickets).

The heartbeat rides the consumer's timer, which stops while the consumer reconnects to the
broker; the pool's tasks run on meanwhile. :class:`HeartbeatWatch` keeps the lease (and the
re-assertion) going from a thread of its own when that timer has been silent too long, so a
broker outage longer than ``instance_ttl`` does not free the slots of running tasks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..admission.base import AdmissionBackend
from ..config import QueueConfig
from ..errors import FlowControlError, UnknownQueueError
from ..protocol import ephemeral_config
from .holdings import Holdings
from .ledger import Ledger

logger = logging.getLogger(__name__)

#: Every how many re-assertion passes the busy slots are checked for lost releases.
STALE_EVERY = 3


def restore_queue(backend: AdmissionBackend, instance: str, config: QueueConfig,
                  ledger: Ledger) -> list[str]:
    """Restore what *ledger* holds in queue ``config.name`` (creating the queue if it is
    gone); the ids the backend recorded again."""
    held = ledger.entries(config.name)
    ids = backend.restore(instance, config, [e.slot for e in held])
    if ids:
        logger.warning("flowcontrol: the admission backend had forgotten %d slot(s) of queue %r "
                       "held by %s; restored", len(ids), config.name, instance)
        # A task that finished while the call was on its way released a slot the backend did
        # not know yet: release it again now that it is known (a manual slot outlives its
        # task: it stays). Ids are never reused, so a second release changes nothing.
        manual = {e.slot.slot_id for e in held if e.manual}
        still = {e.slot.slot_id for e in ledger.entries(config.name)}
        for slot_id in set(ids) - still - manual:
            backend.release(slot_id)
    return ids


class Reasserter:
    """The waker's heartbeat chore: :func:`restore_queue` for every queue this instance holds
    a slot in or asked in lately, and for every configured queue once one is found gone
    (module docstring)."""

    def __init__(self, *, backend: AdmissionBackend, instance: str, ledger: Ledger,
                 configured: Iterable[QueueConfig],
                 config_of: Callable[[str], QueueConfig | None],
                 holdings: Holdings | None = None) -> None:
        self.backend = backend
        self.instance = instance
        self.ledger = ledger
        self.configured = {c.name: c for c in configured}
        self.config_of = config_of
        self.holdings = holdings if holdings is not None else Holdings(ledger)
        self.last = time.monotonic()  # when the last pass began (HeartbeatWatch reads it)
        self.passes = 0
        self._stale: set[str] = set()  # slot ids found stale at the last check
        self._lock = threading.Lock()  # the waker and HeartbeatWatch may both call

    def reassert(self) -> int:
        """One pass; how many slots were restored."""
        with self._lock:
            self.last = time.monotonic()
            self.passes += 1
            held = self.holdings.held()
            names = [*self.configured, *held] if self._configured_lost() else self.holdings.queues()
            restored = 0
            for name in dict.fromkeys(names):
                config = self._config(name)
                if config is not None:
                    restored += len(restore_queue(self.backend, self.instance, config, self.ledger))
            if self.passes % STALE_EVERY == 0:
                self.release_stale(c for c in map(self._config, self.holdings.queues()) if c)
            return restored

    def heartbeat(self) -> None:
        """Renew this instance's lease where it holds slots (the rest lapse harmlessly)."""
        self.backend.heartbeat(self.instance, queues=self.holdings.held())

    def _config(self, name: str) -> QueueConfig | None:
        return self.configured.get(name) or ephemeral_config(name) or self.config_of(name)

    def _configured_lost(self) -> bool:
        """True if the configured queue whose turn it is is gone from the backend."""
        if not self.configured:
            return False
        names = list(self.configured)
        try:
            self.backend.get_config(names[self.passes % len(names)])
        except UnknownQueueError:
            return True
        return False

    def release_stale(self, configs: Iterable[QueueConfig]) -> list[str]:
        """Withdraw the waiters and grants of *configs* that ran here already, and release
        the slots the backend says this instance holds there but no task here holds, stale at
        this check and the one before (module docstring); the released ids."""
        stale: set[str] = set()
        for config in configs:
            self._withdraw_finished(config.name)
            if config.release == "manual":
                continue
            mine = {e.slot.slot_id for e in self.ledger.entries(config.name)}
            stale.update(s.slot_id for s in self.backend.busy_slots(config.name)
                         if s.holder == self.instance and s.slot_id not in mine)
        released = sorted(stale & self._stale)
        for slot_id in released:
            self.backend.release(slot_id)
        if released:
            logger.warning("flowcontrol: the admission backend counted %d slot(s) held by %s "
                           "that no task here holds (a release lost with a Redis failover?); "
                           "released", len(released), self.instance)
        self._stale = stale - set(released)
        return released

    def _withdraw_finished(self, queue: str) -> None:
        """Withdraw waiters and grants of *queue* whose ticket finished here after they were
        made (a line restored by a failover from a replica that missed their removal)."""
        since = {w.task_id: w.since for w in self.backend.waiters(queue, limit=100)}
        since.update((g.task_id, g.granted_at) for g in self.backend.pending_grants(queue))
        for ticket, at in since.items():
            finished = self.ledger.finished_at(queue, ticket)
            if finished is not None and finished > at and not self.ledger.running(queue, ticket):
                logger.warning("flowcontrol: ticket %s of queue %r ran here already but is back "
                               "in line (a Redis failover?); withdrawn", ticket, queue)
                self.backend.withdraw(queue, ticket)


class HeartbeatWatch(threading.Thread):
    """Heartbeat and re-assert from this thread whenever the waker's chores have not done it
    for 1.5 heartbeat intervals (the consumer's timer is stopped while it reconnects)."""

    def __init__(self, reasserter: Reasserter, every: float) -> None:
        super().__init__(name="flowcontrol-heartbeat-watch", daemon=True)
        self.reasserter = reasserter
        self.every = every
        self._halt = threading.Event()

    def run(self) -> None:
        r = self.reasserter
        while not self._halt.wait(self.every / 2):
            if time.monotonic() - r.last < self.every * 1.5:
                continue
            try:
                r.heartbeat()
                r.reassert()
            except FlowControlError as exc:  # the waker logs outages; try again next round
                logger.debug("flowcontrol: heartbeat watch: %s", exc)
            except Exception:  # the thread must survive a bug
                logger.exception("flowcontrol: heartbeat watch failed")

    def stop(self) -> None:
        self._halt.set()
