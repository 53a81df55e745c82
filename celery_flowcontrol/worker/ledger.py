"""The worker's ledger of admitted messages: which slot each one holds, until it settles.

Keyed by (task id, delivery tag): a retry of a task is a new message with the same task id,
and it can be admitted before the request of the previous attempt has finished and released.
Every finish path pops its entry once, so a slot is released exactly once per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..admission.base import Slot

Key = tuple[str, Any]


@dataclass(frozen=True)
class Entry:
    """One slot an admitted message holds, and whether it outlives the task."""

    slot: Slot
    manual: bool


@dataclass
class Admission:
    """What one admitted message holds: its queue's slot (if it is on a flow queue), the
    slots ``acquire_slot`` asked for by queue, the queues whose acquire timed out, and the
    ones it named that nobody registered."""

    entries: list[Entry] = field(default_factory=list)
    primary: str | None = None
    acquired: dict[str, str] = field(default_factory=dict)
    expired: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


class Ledger:
    """Thread-safe map of admitted messages to their slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, Admission] = {}

    def add(self, key: Key, admission: Admission) -> None:
        with self._lock:
            self._entries[key] = admission

    def get(self, key: Key) -> Admission | None:
        with self._lock:
            return self._entries.get(key)

    def pop(self, key: Key) -> Admission | None:
        """Take the entry of a settled message (``None`` if it was popped before)."""
        with self._lock:
            return self._entries.pop(key, None)

    def drain(self) -> list[Entry]:
        """Take every entry (warm shutdown: admitted but never finished)."""
        with self._lock:
            entries = [e for a in self._entries.values() for e in a.entries]
            self._entries.clear()
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
