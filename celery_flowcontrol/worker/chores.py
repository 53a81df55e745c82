"""The waker's periodic chores (waker.py), run on its thread at each tick of the consumer's timer.

The instance heartbeat (then the re-assertion of what this instance holds, reassert.py), the
releases that failed during an outage, the reclaim pass with the sweep of ``flow_batch`` calls
a dead producer left (waking.py's ``BatchChores``), forgetting old woken rows
(parking/wakes.py), and the grants whose announcement was missed. The heartbeat, the reclaim
pass and the grant rescue read the queues where this instance holds slots or waits
(holdings.py), not every registered queue: the pass over every queue is the beat task's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from ..admission.base import AdmissionBackend
from ..errors import FlowControlError
from ..parking import ParkingStore
from ..protocol import task_id_of
from .holdings import Holdings
from .waking import BatchChores

__all__ = ["Chores", "FORGET_EVERY", "RESCUE_AFTER", "Reasserts"]

logger = logging.getLogger(__name__)

#: A pending grant is rescued by the poller only after this long (the announcement usually
#: wins; rescuing at once would race it).
RESCUE_AFTER = 1.0
#: Seconds between two passes that forget old woken rows (``ParkingStore.wakes``: ``Wakes.forget``).
FORGET_EVERY = 60.0


class Reasserts(Protocol):
    """What the heartbeat chore has re-assert after each heartbeat (reassert.py's
    ``Reasserter``): tells a backend that forgot this instance what it holds."""

    def reassert(self) -> object:
        ...


class Chores:
    """One worker instance's periodic chores, each at its own period (the module docstring)."""

    def __init__(self, *, app: Any, backend: AdmissionBackend, store: ParkingStore, instance: str,
                 heartbeat_every: float, reclaim_every: float, coming: BatchChores,
                 reassert: Reasserts | None = None,
                 holdings: Holdings | None = None) -> None:
        self.app = app
        self.backend = backend
        self.store = store
        self.instance = instance
        self.heartbeat_every = heartbeat_every
        self.reclaim_every = reclaim_every
        self.coming = coming  # the flow_batch chores (waking.py)
        self.reasserts = reassert  # after each heartbeat (reassert.py)
        self.holdings = holdings  # the queues the chores sweep (holdings.py); None: every queue
        self._lock = threading.Lock()
        self._releases: list[str] = []
        self._last_heartbeat = 0.0
        self._last_reclaim = 0.0
        self._last_forget = 0.0

    def retry_release(self, slot_id: str) -> None:
        """A release failed (backend outage): try it again at each run until it lands."""
        with self._lock:
            self._releases.append(slot_id)

    def heartbeat(self, now: float) -> None:
        """The instance heartbeat, then the re-assertion, every ``heartbeat_every``."""
        if now - self._last_heartbeat >= self.heartbeat_every:
            self.backend.heartbeat(self.instance, queues=self.holdings.held() if self.holdings else None)
            if self.reasserts is not None:
                self.reasserts.reassert()
            self._last_heartbeat = now

    def release_failed(self) -> None:
        """Release the slots whose release failed; those that fail again are kept."""
        with self._lock:
            releases, self._releases = self._releases, []
        for i, slot_id in enumerate(releases):
            try:
                self.backend.release(slot_id)
            except FlowControlError:
                with self._lock:
                    self._releases.extend(releases[i:])
                raise

    def sweep(self, now: float) -> list[str]:
        """The reclaim pass and the batch sweep (every ``reclaim_every``), forgetting old woken
        rows (every :data:`FORGET_EVERY`); the task ids of the grants to rescue now."""
        mine = self.holdings.queues() if self.holdings else None
        if now - self._last_reclaim >= self.reclaim_every:
            self.backend.reclaim(queues=mine)
            self._last_reclaim = now
            self.coming.sweep(self.app)  # calls a dead producer left with no batch
        if now - self._last_forget >= FORGET_EVERY:
            self.store.wakes.forget(now)
            self._last_forget = now
        return [task_id_of(g.task_id) for g in self.backend.pending_grants(queues=mine)
                if now - g.granted_at >= RESCUE_AFTER]

    def batches_coming(self, now: float) -> None:
        """Put the batches coming due soon on the waker's timer (waking.py's ``BatchChores``)."""
        self.coming.remember(self.store, now)
