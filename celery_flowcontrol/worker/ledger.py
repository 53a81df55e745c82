"""The worker's ledger of admitted messages: which slot each one holds, until it finishes.

Keyed by (task id, delivery tag): a retry of a task is a new message with the same task id,
and it can be admitted before the request of the previous attempt has finished and released.
Every finish path pops its entry once, so a slot is released exactly once per process.

It also knows which tickets run here: a second delivery of a ticket whose first one is still
unfinished in this worker (the broker redelivers what a dropped channel left unacked, while
the first copy still waits in the pool) must not run beside it on the one slot they share.
Each entry keeps the Celery request built for its message, so that what Celery drops unrun
on a broker reconnect can be told from what still runs (``Releaser.finish_dropped``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..admission.base import Slot

#: Finished tickets a ledger remembers (worker/reassert.py withdraws them from a line that
#: still shows them after a Redis failover lost the writes that took them out).
FINISHED_KEPT = 10_000

Key = tuple[str, Any]


@dataclass(frozen=True, slots=True)
class Entry:
    """One slot an admitted message holds, and whether it outlives the task."""

    slot: Slot
    manual: bool


@dataclass(slots=True)
class Admission:
    """What one admitted message holds: its queue's slot (if it is on a flow queue), the
    slots ``acquire_slot`` asked for by queue, the queues whose acquire timed out, the
    ones it named that nobody registered, and the request Celery built for it (set by
    ``FlowRequest``; ``None`` until then)."""

    entries: list[Entry] = field(default_factory=list)
    primary: str | None = None
    acquired: dict[str, str] = field(default_factory=dict)
    expired: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    request: Any = None


class Ledger:
    """Thread-safe map of admitted messages to their slots."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # the wall clock finished tickets are stamped with
        self._lock = threading.Lock()
        self._entries: dict[Key, Admission] = {}
        self._tickets: dict[tuple[str, str], int] = {}  # (queue, ticket) -> entries holding it
        #: (queue, ticket) -> wall-clock time its last entry here finished, newest last, at most
        #: FINISHED_KEPT: what a backend that lost writes may still count as waiting or granted.
        self._finished: dict[tuple[str, str], float] = {}
        #: queue -> when this instance last asked admission there (holdings.py reads it).
        self._asked: dict[str, float] = {}

    def add(self, key: Key, admission: Admission) -> None:
        with self._lock:
            self._entries[key] = admission
            for e in admission.entries:
                t = (e.slot.queue, e.slot.task_id)
                self._tickets[t] = self._tickets.get(t, 0) + 1

    def asked(self, queue: str) -> None:
        """This instance asks admission in *queue* (the consumer's loop: one dict write)."""
        self._asked[queue] = self.clock()

    def asked_since(self, since: float) -> list[str]:
        """The queues asked in at *since* or later (this ledger's clock); older ones are
        forgotten."""
        asked = dict(self._asked)  # a copy: the consumer's loop writes meanwhile
        for name, at in asked.items():
            # (An ask landing between the check and the delete is forgotten: its queue is
            # left out until this instance asks there again, which only delays a sweep.)
            if at < since and self._asked.get(name) == at:
                self._asked.pop(name, None)
        return [name for name, at in asked.items() if at >= since]

    def running(self, queue: str, ticket: str) -> bool:
        """True if an unfinished message admitted here holds a slot of *queue* for *ticket*."""
        return (queue, ticket) in self._tickets

    def get(self, key: Key) -> Admission | None:
        with self._lock:
            return self._entries.get(key)

    def pop(self, key: Key) -> Admission | None:
        """Take the entry of a finished message (``None`` if it was popped before)."""
        with self._lock:
            admission = self._entries.pop(key, None)
            for e in admission.entries if admission is not None else ():
                self._forget(e)
            return admission

    def _forget(self, e: Entry) -> None:
        t = (e.slot.queue, e.slot.task_id)
        left = self._tickets.get(t, 0) - 1
        if left > 0:
            self._tickets[t] = left
        else:
            self._tickets.pop(t, None)
            self._finished.pop(t, None)
            self._finished[t] = self.clock()
            if len(self._finished) > FINISHED_KEPT:
                del self._finished[next(iter(self._finished))]

    def finished_at(self, queue: str, ticket: str) -> float | None:
        """When the last message admitted here for *ticket* of *queue* finished (wall clock),
        if it is among the last :data:`FINISHED_KEPT` that did."""
        with self._lock:
            return self._finished.get((queue, ticket))

    def items(self) -> list[tuple[Key, Admission]]:
        """A snapshot of every unfinished admission, with its key."""
        with self._lock:
            return list(self._entries.items())

    def drain(self) -> list[Entry]:
        """Take every entry (warm shutdown: admitted but never finished)."""
        with self._lock:
            entries = [e for a in self._entries.values() for e in a.entries]
            self._entries.clear()
            self._tickets.clear()
            return entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def entries(self, queue: str | None = None) -> list[Entry]:
        """The slots held through this ledger (of *queue* only, if given)."""
        with self._lock:
            return [e for a in self._entries.values() for e in a.entries
                    if queue is None or e.slot.queue == queue]

    def held(self) -> dict[str, int]:
        """Slots held through this ledger, by queue."""
        counts: dict[str, int] = {}
        with self._lock:
            for a in self._entries.values():
                for e in a.entries:
                    counts[e.slot.queue] = counts.get(e.slot.queue, 0) + 1
        return counts
