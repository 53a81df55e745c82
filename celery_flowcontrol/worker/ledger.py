"""The worker's ledger of admitted messages: which slot each one holds, until it settles.

Keyed by (task id, delivery tag): a retry of a task is a new message with the same task id,
and it can be admitted before the request of the previous attempt has finished and released.
Every finish path pops its entry once, so a slot is released exactly once per process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..admission.base import Slot

Key = tuple[str, Any]


@dataclass(frozen=True)
class Entry:
    """One admitted message: its slot, and whether the slot outlives the task."""

    slot: Slot
    manual: bool


class Ledger:
    """Thread-safe map of admitted messages to their slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}

    def add(self, key: Key, entry: Entry) -> None:
        with self._lock:
            self._entries[key] = entry

    def get(self, key: Key) -> Entry | None:
        with self._lock:
            return self._entries.get(key)

    def pop(self, key: Key) -> Entry | None:
        """Take the entry of a settled message (``None`` if it was popped before)."""
        with self._lock:
            return self._entries.pop(key, None)

    def drain(self) -> list[Entry]:
        """Take every entry (warm shutdown: admitted but never finished)."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            return entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def held(self) -> dict[str, int]:
        """Slots held through this ledger, by queue."""
        counts: dict[str, int] = {}
        with self._lock:
            for e in self._entries.values():
                counts[e.slot.queue] = counts.get(e.slot.queue, 0) + 1
        return counts
