"""Park: a denied message is committed to the parking table, and only then acked.

The row is unique by task id, so a redelivery parks once; a message whose row a waker is
republishing right now is that row's own copy and must not be acked yet (the gate tries it
again in a moment). A message the database can never store is dead-lettered instead, and
acked once it is kept there; what a row keeps of a message is message.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..admission.base import AdmissionBackend
from ..errors import FlowControlError
from ..parking import ParkedMessage, ParkingRejectedError, ParkingStore
from ..protocol import ticket_id
from .crashpoints import crashpoint
from .delivery import Delivery
from .ledger import Entry
from .message import parked_of
from .parked_state import ParkedStates
from .waker import Waker

logger = logging.getLogger(__name__)


class Parker:
    """Parks the denied messages of one worker instance."""

    def __init__(self, *, store: ParkingStore, backend: AdmissionBackend, waker: Waker,
                 clock: Callable[[], float], states: ParkedStates | None = None) -> None:
        self.store = store
        self.states = states
        self.backend = backend
        self.waker = waker
        self.clock = clock
        self.parked = 0

    def park(self, message: Any, *, task_name: str, queue: str, priority: int,
             key: str | None, wake_at: float, reason: str, ack: Callable[[], Any]) -> bool:
        """Park *message* until *wake_at* (or its expiry) and ack it; ``False`` if it must
        not be acked yet (its row is being republished: try again in a moment)."""
        headers = message.headers or {}
        task_id = str(headers.get("id"))
        parked = parked_of(message, task_id=task_id, queue=queue, task_name=task_name,
                           priority=priority, key=key, wake_at=wake_at, reason=reason,
                           now=self.clock())
        crashpoint("park.before_commit")
        try:
            if not self._park_once(parked):
                # The republished copy of a row a waker has not deleted yet: acking it now
                # would let that delete lose the message.
                return False
        except ParkingRejectedError as exc:
            self._dead_letter(parked, exc)
            ack()  # only now: it is kept in the dead-letter table
            return True
        crashpoint("park.committed")
        ack()  # only now: the row is committed
        crashpoint("park.acked")
        self.stored(parked)
        self.committed([parked])
        return True

    def committed(self, rows: list[ParkedMessage]) -> None:
        """*rows* are committed and acked: their ``PARKED`` state, if tracked (parked_state.py)."""
        if self.states is not None:
            self.states.committed(rows, self.clock())

    def stored(self, row: ParkedMessage) -> None:
        """*row* is committed and its message acked (here or in a batch, parkbatch.py): count
        it, and let the waker wake it when its grant came first or it is due."""
        self.parked += 1
        self.waker.parked(row)

    def _dead_letter(self, parked: ParkedMessage, exc: ParkingRejectedError) -> None:
        """Not an outage: this message can never be parked. Keep it in the dead-letter table
        (visible to operators) rather than loop on it."""
        logger.error("flowcontrol: task %s can't be parked (%s): dead-lettered",
                     parked.task_id, exc)
        self.store.dead_letter(parked, "park-rejected", exc)
        try:
            self.backend.withdraw(parked.queue, ticket_id(parked.headers))
        except FlowControlError:
            pass  # not waiting there (or not registered): nothing to take out of line

    def adopt(self, d: Delivery, entries: list[Entry]) -> bool:
        """*d*, delivered again by the broker, is admitted to run (holding *entries*): if the
        row it was parked as still waits (the node died between the park's commit and its
        ack), take the row out, so that the two are one run. ``False`` if a waker leased that
        row: its woken copy is the one to run, so *d* gives its slots back and is acked unrun."""
        if not (d.message.delivery_info or {}).get("redelivered"):
            return True  # a first delivery was never parked: nothing to read
        if self.store.get(d.task_id) is None:
            return True
        claimed = self.store.claim_many([d.task_id])
        if claimed and ticket_id(claimed[0].headers) != d.ticket:
            self.store.unclaim([d.task_id])  # another run of the task (a retry): not this one's
            return True
        if claimed:
            self.store.done([d.task_id])
            logger.info("flowcontrol: task %s is delivered again and admitted; its parked row "
                        "is taken out, so it runs once", d.task_id)
            return True
        # Leased by a waker since the read (or before it): its copy is published, or will be
        # once the lease runs out; deleted meanwhile, it was published already.
        logger.info("flowcontrol: task %s is delivered again while its parked row is woken; "
                    "the woken copy runs", d.task_id)
        for entry in entries:
            try:
                self.backend.release(entry.slot.slot_id)
            except FlowControlError:
                pass  # held by no task here: the ledger check of reassert.py frees it
        d.ack()
        return False

    def _park_once(self, parked: ParkedMessage) -> bool:
        """Store *parked* unless its row is already stored; False if the row is one a waker
        is republishing right now (this message is its copy: it must not be acked yet)."""
        for _ in range(3):
            if self.store.park(parked):
                return True
            row = self.store.get(parked.task_id)
            if row is None:
                continue  # the waker deleted the row this copy came from: store it again
            # A waiting row: this is a redelivery of what is stored already (acking is safe).
            return not (row.claimed_until or 0.0) > self.clock()  # a waker holds its lease
        return False
