"""Waking on time: a worker's timer on the earliest ``wake_at`` it knows.

Woken only by the poll (each tick of the consumer's timer, ``flowcontrol_poll_interval``), a
row parked until an instant (an ETA or countdown, a rate limit's turn, a concurrency waiter's
retry) comes back up to a poll late, and a rate-held line comes back in poll-sized bursts: a
poll's worth of republished waiters at once, in front of every fresh message, each up to a poll
late, and the window's room in between unused. So the waker keeps the rows it knows (those this
worker parked, and those it claimed and gave back) that wait for an instant, not for a slot
(whose grant wakes them), earliest first, and claims them by task id when they come due, at
most once per :data:`GRAIN` (rows due within it together, in one transaction). A row only
another worker knows (or one parked before a restart) is still woken by the poll, which stays
the safety net for every row (a ``flow_batch`` batch, which a producer parks, is looked for
ahead at each poll: :class:`BatchChores`); a row woken otherwise meanwhile (by its grant, by the poll) is
simply not found.

A row is claimed a *lead* before its ``wake_at``, so that the way back (a claim, a publish, a
delivery, the consumer's own work for each message, which a burst of due rows queues up) is
gone through before the instant rather than after it. :data:`LEAD` for every row: a copy within
the gate's ``ETA_SLACK`` of its ETA goes to Celery, which holds it until then as it does any
ETA task, and a rate-held one is already told a turn on the early side. An ETA row is not
claimed further ahead for its copy to linger until its ETA (linger.py): lingering has room for
a few, and a burst of countdowns coming due together would find it full, each copy past the
room parked again and woken again until room freed (40 countdowns of 1-1.9 s: half of them
started up to 0.8 s late, `python -m benchmarks punctual`). Times are instants of the
admission clock, as ``wake_at`` is.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
from typing import Any

from ..parking import ParkedMessage
from ..reasons import FOR_A_SLOT
from .linger import Lingering
from .wake_items import DUE, WorkItem

logger = logging.getLogger(__name__)

__all__ = ["DUE", "GRAIN", "LEAD", "MEMORY", "BatchChores", "WakeTimes", "lead_for"]

#: Rows known here are claimed at most once per this many seconds.
GRAIN = 0.05
#: A row is claimed this long before its ``wake_at`` (under the gate's ETA_SLACK).
LEAD = 0.04
#: At most this many rows are remembered; one past it is woken by the poll, as any other
#: worker's row is.
MEMORY = 20_000
#: Batches due within this many seconds are put on the timer at each poll (a few polls).
BATCH_LOOKAHEAD = 5.0


def lead_for(reason: str, lingering: Lingering | None) -> float:
    """How long before its ``wake_at`` a row parked for *reason* is claimed by a worker with
    these *lingering* waiters: :data:`LEAD`, whatever may linger (module docstring)."""
    return LEAD


class WakeTimes:
    """The rows one worker knows, by when to claim them, earliest first (any thread)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []  # (when to claim it, task id)
        self._lock = threading.Lock()
        self._claimed = float("-inf")  # when known rows were last claimed

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, task_id: str, at: float) -> bool:
        """Claim *task_id* at *at*; True if it is the earliest now (a timer set for the one
        before must be set again)."""
        with self._lock:
            if len(self._heap) >= MEMORY:
                return False
            heapq.heappush(self._heap, (at, task_id))
            return self._heap[0][0] == at

    def remember(self, rows: list[ParkedMessage], lingering: Lingering | None) -> bool:
        """Claim each of *rows* (parked here, or claimed and given back) its lead before its
        ``wake_at``, but one waiting for a slot: its grant wakes it, and its ``wake_at`` is
        only the safety re-check that the poll makes. True if one is the earliest now."""
        earliest = False
        for m in rows:
            if m.reason not in FOR_A_SLOT:
                earliest = self.add(m.task_id, m.wake_at - lead_for(m.reason, lingering)) or earliest
        return earliest

    def wait(self, now: float) -> float | None:
        """Seconds from *now* until known rows should be claimed (0 or less: now); ``None``
        while none is remembered."""
        with self._lock:
            if not self._heap:
                return None
            at = self._heap[0][0]
        return max(at, self._claimed + GRAIN) - now

    def due(self, now: float) -> bool:
        """True if known rows should be claimed at *now*."""
        wait = self.wait(now)
        return wait is not None and wait <= 0

    def claiming(self, now: float) -> list[str]:
        """The task ids to claim at *now* (forgotten here from now on)."""
        ids = []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                ids.append(heapq.heappop(self._heap)[1])
        self._claimed = now
        return ids

    def sort(self, claimed: list[ParkedMessage], now: float, lingering: Lingering | None
             ) -> tuple[list[ParkedMessage], list[ParkedMessage]]:
        """Rows claimed at *now* as known here: those due, and those parked again meanwhile
        until later (woken by a grant, denied elsewhere), remembered at their new time."""
        due: list[ParkedMessage] = []
        later: list[ParkedMessage] = []
        for m in claimed:
            at = m.wake_at - lead_for(m.reason, lingering)
            (due if at <= now else later).append(m)
            if at > now:
                self.add(m.task_id, at)
        return due, later

    def take(self, inbox: queue.SimpleQueue[WorkItem], now: float, idle: bool = False) -> WorkItem:
        """The next item of *inbox*, waited for until known rows should be claimed (without
        end while *idle*: during an outage known rows wait for the poll, whose chores find its
        end; or while none is remembered); :data:`~.wake_items.DUE` if they come first."""
        wait = None if idle else self.wait(now)
        try:
            return inbox.get() if wait is None else inbox.get(wait > 0, max(wait, 0.0))
        except queue.Empty:
            return DUE


class BatchChores:
    """A waker's ``flow_batch`` chores. :meth:`remember`: batches coming due go on the
    worker's :class:`WakeTimes` at each poll (a producer parked them, so no worker knows them
    but by a look, ``BatchRows.coming``, and the poll alone would find each up to a poll
    late; every worker remembers them, the first to claim one wakes it, the others find it
    gone). :meth:`sweep`: calls a dead producer left with no batch get one."""

    def __init__(self, due: WakeTimes) -> None:
        self.due = due
        self._seen: dict[str, float] = {}  # batch rows remembered here -> their wake_at

    def remember(self, store: Any, now: float) -> None:
        """Look for batches due by ``now + BATCH_LOOKAHEAD`` in *store* (a ParkingStore)."""
        from ..parking.batches import BatchRows

        seen = self._seen
        for task_id in [t for t, at in seen.items() if at <= now]:
            del seen[task_id]
        for task_id, at in BatchRows(store).coming(now, now + BATCH_LOOKAHEAD):
            if seen.get(task_id) != at:
                seen[task_id] = at
                self.due.add(task_id, at - LEAD)

    @staticmethod
    def sweep(app: Any) -> None:
        """Start a batch for calls a producer that died left with none to come
        (collapse/batching.py's ``sweep``); an outage is logged, and the next pass tries again."""
        from ..collapse.batching import sweep

        try:
            sweep(app)
        except Exception as exc:  # the waker's other chores go on
            logger.warning("flowcontrol: can't sweep flow_batch calls: %s", exc)
