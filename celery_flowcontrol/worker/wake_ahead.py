"""Waking ahead: when a line moves, the next parked waiters come back before their grant.

When a grant is handed over in a queue (to a waiter lingering here, linger.py, or through its
parked row), the next parked waiters of that queue are woken ahead of their grant, as many as
the worker has room for: they come back, are denied again (a waiter keeps its place in line)
and linger, so that their own grants find them in memory. That keeps the SQL and broker round
trips off the path from a release to the next start while the queue is busy; when nothing
moves, nothing is woken early.

:class:`WakeAhead` is the policy: whether a hand-over asks the waker at all
(:meth:`WakeAhead.handed`, on the consumer's loop), which rows to claim (:meth:`WakeAhead.plan`)
and which of those claimed to wake (:meth:`WakeAhead.choose`); the waker claims and publishes.

* Only waiters parked for a slot are woken ahead: one a rate limit holds comes back at its
  turn (the backend paces a rate-held line, one turn per waiter ahead), and woken early it
  would only be parked again, a round trip through SQL and the broker in front of every fresh
  message. A queue whose next rows were all rate-held is not woken ahead for
  :data:`EMPTY_RECHECK`.
* A queue found with no parked row is not looked at again for :data:`EMPTY_RECHECK`, unless
  this worker parks a row meanwhile: in a busy line whose waiters all linger, hand-overs come
  hundreds of times a second, and each would otherwise cost a count in SQL and a turn of the
  waker's thread, on the GIL the consumer's loop needs.
* Those woken ahead and not back yet count against the room (until the linger bound passes):
  without it a slow fleet would wake more than can linger, and park the rest again.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from ..admission.base import AdmissionBackend
from ..errors import UnknownQueueError
from ..parking import ParkedMessage, ParkingStore
from ..protocol import task_id_of
from ..reasons import FOR_A_SLOT
from .linger import Lingering
from .wake_items import Ahead, WorkItem

__all__ = ["AHEAD_SCAN", "EMPTY_RECHECK", "LINGERS", "Plan", "WakeAhead"]

#: How far past the waiters it wants the waker looks down a line for parked ones to wake
#: ahead of their grant (the head of a busy line lingers in some worker already).
AHEAD_SCAN = 16
#: The parking reasons of waiters woken ahead: those that linger once back (linger.py).
LINGERS = FOR_A_SLOT
#: How long a queue found with no parked row is not counted again for wake-ahead (unless
#: this worker parks one meanwhile): a row another worker parks waits at most this much
#: longer to be woken ahead of its grant; its grant still wakes it at once.
EMPTY_RECHECK = 0.5


@dataclass(frozen=True)
class Plan:
    """The rows of one queue to claim for waking ahead."""

    queue: str
    n: int  # how many to wake at most
    line: list[str]  # task ids, next in the backend's line first
    recent: dict[str, float]  # woken ahead lately and not back yet -> when
    at: float  # monotonic


class WakeAhead:
    """One worker instance's wake-ahead policy (module docstring)."""

    def __init__(self, *, store: ParkingStore, backend: AdmissionBackend,
                 inbox: queue.SimpleQueue[WorkItem]) -> None:
        self.store = store
        self.backend = backend
        self.inbox = inbox
        self._ahead: dict[str, dict[str, float]] = {}  # queue -> task id -> woken ahead at
        self._empty: dict[str, float] = {}  # queue -> when it was counted with no row
        self._paced: dict[str, float] = {}  # queue -> when its next rows were all rate-held
        self._parked_at = 0.0  # when this worker last parked a row (monotonic)

    def handed(self, queue: str, n: int = 1) -> None:
        """A lingering waiter of *queue* got its grant (any thread): ask the waker to wake the
        next *n* parked waiters ahead of theirs, so the worker keeps as many lingering."""
        empty = self._empty.get(queue)
        if empty is not None and empty > self._parked_at and \
                time.monotonic() - empty < EMPTY_RECHECK:
            return  # none parked a moment ago, and none parked here since
        if time.monotonic() - self._paced.get(queue, float("-inf")) < EMPTY_RECHECK:
            return  # its next waiters wait for rate limits a moment ago: nothing to linger
        self.inbox.put(Ahead(queue, n))

    def parked(self) -> None:
        """This worker parked a row: a queue counted empty is looked at again."""
        self._parked_at = time.monotonic()

    def plan(self, queue: str, n: int | None, lingering: Lingering) -> Plan | None:
        """What to claim to wake *n* (None: as many as there is room for) of *queue*'s next
        parked waiters into *lingering*; None if nothing is to be woken."""
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
            self._remember(queue, recent)
            return None
        # "Next" in the backend's line: the table's order drifts from it (a waiter woken by
        # its retry tick and parked again gets a new seq). Those lingering here or elsewhere, or
        # on their way, have no row to claim and are passed over.
        try:
            waiters = self.backend.waiters(queue, n + AHEAD_SCAN)
        except UnknownQueueError:
            return None  # a flow_group's queue, gone with its group
        line = [task_id_of(w.task_id) for w in waiters if w.task_id not in lingering]
        return Plan(queue, n, line, recent, now)

    def choose(self, plan: Plan, claimed: list[ParkedMessage]
               ) -> tuple[list[ParkedMessage], list[ParkedMessage]]:
        """Of the rows *plan* claimed: those to wake, in line order, and those to give back."""
        by_id = {m.task_id: m for m in claimed}
        ordered = [by_id[t] for t in dict.fromkeys(plan.line) if t in by_id]
        # Only a waiter parked for a slot would linger once back: one a rate limit holds
        # comes back at its turn (its wake_at), and woken now it would only be parked again.
        chosen = [m for m in ordered if m.reason in LINGERS][:plan.n]
        spare = [m for m in ordered if m not in chosen]
        if ordered and not chosen:
            self._paced[plan.queue] = time.monotonic()
        self._remember(plan.queue, plan.recent | {m.task_id: plan.at for m in chosen})
        return chosen, spare

    def _remember(self, queue: str, woken: dict[str, float]) -> None:
        """Keep *queue*'s woken-ahead waiters, and no entry for a queue with none (a
        flow_group's queue is gone with its group)."""
        if woken:
            self._ahead[queue] = woken
        else:
            self._ahead.pop(queue, None)
