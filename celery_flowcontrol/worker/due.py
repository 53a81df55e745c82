"""When the rows this worker parked come due: the waker sleeps until the earliest.

Woken only at the poll (each tick of the consumer's timer), a rate-held line would come back
in bursts, a poll's worth of republished waiters at once in front of every fresh message, and
each waiter up to a poll late. So the parker tells the waker each row's ``wake_at``; the waker
claims the due rows when the earliest comes, at most once per :data:`DUE_GRAIN` (rows due
within it are woken together, one claim transaction). A row another worker parked (or one
parked before a restart) is still woken by the poll.
"""

from __future__ import annotations

import heapq
import threading

#: Due rows are claimed at most once per this many seconds.
DUE_GRAIN = 0.05
#: At most this many due times are remembered; a row past it is woken by the poll, as any
#: other worker's row is.
DUE_MEMORY = 20_000


class DueTimes:
    """A heap of the ``wake_at`` of rows parked here (any thread)."""

    def __init__(self) -> None:
        self._heap: list[float] = []
        self._lock = threading.Lock()
        self._claimed = float("-inf")  # when due rows were last claimed

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, wake_at: float) -> None:
        """A row parked here comes due at *wake_at* (the admission clock's seconds)."""
        with self._lock:
            if len(self._heap) < DUE_MEMORY:
                heapq.heappush(self._heap, wake_at)

    def wait(self, now: float) -> float:
        """Seconds from *now* until due rows should be claimed; ``inf`` if none is remembered."""
        with self._lock:
            if not self._heap:
                return float("inf")
            due = self._heap[0]
        return max(due, self._claimed + DUE_GRAIN) - now

    def claiming(self, now: float) -> None:
        """Due rows are being claimed at *now*: forget every time up to it (a row that was woken
        otherwise, by its grant, leaves a time that costs one empty claim)."""
        with self._lock:
            while self._heap and self._heap[0] <= now:
                heapq.heappop(self._heap)
        self._claimed = now
