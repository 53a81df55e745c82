"""Dead-lettering: a message that can never run by waiting is kept aside, never looped.

Every dead letter of the worker (and of beat's ``wake_due``) goes through
:meth:`Quarantine.put`, with its reason from :class:`~celery_flowcontrol.reasons.DeadReason`:
a message the parking table refuses (park.py), one whose cost no admission can take
(costs.py), a parked row whose wake the broker keeps refusing (republish.py). The message is
kept in the dead-letter table (``celery flowcontrol dead``, requeued from there once its cause
is fixed: parking/dead_letters.py), a parked row it came from is deleted with it, and its
ticket is taken out of its queue's line, so a grant made to it passes on. A database that
can't be reached raises (an outage: the caller keeps the message, unacked or claimed).
"""

from __future__ import annotations

import logging

from ..admission.base import AdmissionBackend
from ..errors import FlowControlError
from ..parking import ParkedMessage, ParkingStore
from ..protocol import ticket_id
from ..reasons import DeadReason

__all__ = ["Quarantine"]

logger = logging.getLogger(__name__)

#: What the log says of each reason.
_SAID = {DeadReason.PARK_REJECTED: "can't be parked",
         DeadReason.COST_REFUSED: "has a cost no admission of its queue takes",
         DeadReason.WAKE_FAILED: "can't be published again"}


class Quarantine:
    """The dead letters of one parking store (module docstring)."""

    def __init__(self, store: ParkingStore, backend: AdmissionBackend | None) -> None:
        self.store = store
        self.backend = backend

    def put(self, row: ParkedMessage, reason: DeadReason, error: BaseException, *,
            parked: bool = False) -> None:
        """Keep *row* in the dead-letter table for *reason* (*error* says the details); with
        *parked*, its parked row goes with it. Then its ticket leaves the line."""
        self.store.dead_letter(row, reason.value, error)
        if parked:
            self.store.done([row.task_id])
        logger.error("flowcontrol: task %s %s (%s: %s): dead-lettered", row.task_id,
                     _SAID[reason], type(error).__name__, error)
        if self.backend is not None:
            try:
                self.backend.withdraw(row.queue, ticket_id(row.headers))
            except FlowControlError:
                pass  # not waiting there (or not registered): a lost waiter is pruned anyway
