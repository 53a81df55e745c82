"""Waking on time: a worker's timer on the earliest ``wake_at`` it knows.

Woken only by the poll (each tick of the consumer's timer, ``flowcontrol_poll_interval``), a
row parked until an instant (an ETA or countdown, a rate limit's turn, a concurrency waiter's
retry) comes back up to a poll late, and a rate-held line comes back in poll-sized bursts: a
poll's worth of republished waiters at once, in front of every fresh message, each up to a poll
late, and the window's room in between unused. So the waker keeps the ``wake_at`` of the rows
it knows (those this worker parked, and those it claimed and gave back) and claims the due
rows when the earliest of them comes, at most once per :data:`GRAIN` (rows due within it are
claimed together, in one transaction). A row only another worker knows (or one parked before a
restart) is still woken by the poll, which stays the safety net for every row.

Rows are claimed a *lead* before they are due, so that the way back (a claim, a publish, a
delivery, the consumer's own work for each message, which a burst of due rows queues up) is
gone through before the instant, not after it. Where a worker lets denied messages linger
(linger.py), the lead is up to :data:`LINGER_LEAD`: a copy that arrives before its ETA or its
rate turn waits for it unparked, in the prefetch window, and is asked again at that instant.
Elsewhere it is :data:`LEAD`, under the gate's ``ETA_SLACK``: such a copy is let through to
Celery, which holds it until its ETA as it does any ETA task. A wake time is an instant of the
admission clock, as ``wake_at`` is.
"""

from __future__ import annotations

import heapq
import queue
import threading
from typing import Any

__all__ = ["DUE", "GRAIN", "LEAD", "LINGER_LEAD", "MEMORY", "WakeTimes", "lead_for"]

#: Due rows are claimed at most once per this many seconds.
GRAIN = 0.05
#: Rows are claimed this long before they are due where nothing lingers (< ETA_SLACK).
LEAD = 0.04
#: The most rows are claimed before they are due where a copy may linger (half the bound).
LINGER_LEAD = 0.25
#: At most this many wake times are remembered; a row past it is woken by the poll, as any
#: other worker's row is.
MEMORY = 20_000
#: What :meth:`WakeTimes.take` returns when due rows come before any item.
DUE: Any = object()


def lead_for(linger: float) -> float:
    """How long before they are due rows are claimed by a worker whose denied messages may
    linger *linger* seconds (0: none may)."""
    return max(LEAD, min(LINGER_LEAD, linger / 2)) if linger > 0 else LEAD


class WakeTimes:
    """The ``wake_at`` of the rows one worker knows, earliest first (any thread)."""

    def __init__(self) -> None:
        self._heap: list[float] = []
        self._lock = threading.Lock()
        self._claimed = float("-inf")  # when due rows were last claimed

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, wake_at: float) -> bool:
        """A row known here comes due at *wake_at*; True if it is the earliest now (a timer
        set for the one before must be set again)."""
        with self._lock:
            if len(self._heap) >= MEMORY:
                return False
            heapq.heappush(self._heap, wake_at)
            return self._heap[0] == wake_at

    def wait(self, now: float, lead: float = LEAD) -> float | None:
        """Seconds from *now* until due rows should be claimed (0 or less: now), *lead*
        before the earliest is due; ``None`` while no row is remembered."""
        with self._lock:
            if not self._heap:
                return None
            due = self._heap[0] - lead
        return max(due, self._claimed + GRAIN) - now

    def due(self, now: float, lead: float = LEAD) -> bool:
        """True if due rows should be claimed at *now*."""
        wait = self.wait(now, lead)
        return wait is not None and wait <= 0

    def claiming(self, now: float, lead: float = LEAD) -> None:
        """Due rows are claimed at *now*, those due within *lead* with them: forget every time
        up to ``now + lead`` (a row woken otherwise, by its grant, leaves a time that costs one
        empty claim)."""
        with self._lock:
            while self._heap and self._heap[0] <= now + lead:
                heapq.heappop(self._heap)
        self._claimed = now

    def take(self, inbox: queue.SimpleQueue[Any], now: float, lead: float = LEAD,
             idle: bool = False) -> Any:
        """The next item of *inbox*, waited for until due rows should be claimed (without end
        while *idle*, or while no row is remembered); :data:`DUE` if they come first."""
        wait = None if idle else self.wait(now, lead)
        try:
            return inbox.get() if wait is None else inbox.get(wait > 0, max(wait, 0.0))
        except queue.Empty:
            return DUE
