"""Park: a denied message is committed to the parking table, and only then acked.

The row is unique by task id, so a redelivery parks once; a message whose row a waker is
republishing right now is that row's own copy and must not be acked yet (the gate tries it
again in a moment). A message the database can never store is dead-lettered instead, and
acked once it is kept there; the Parker owns every dead letter of the gate's (quarantine.py:
this one, and a cost no admission takes, costs.py). What a row keeps of a message is message.py's.

A node that dies between a park's commit and its ack leaves two of one message: the row, and
the message the broker delivers again. They become one run. The second copy, admitted or
denied, meets the row: waiting, it is taken out (admitted: the copy runs) or kept (denied: the
copy is acked, the row runs); leased by a waker, or woken and deleted already (the store
remembers each task id's last wake), the woken copy is the one that runs, and the second copy
is acked unrun. A copy the broker delivers again that a wake published (its header
names the wake: the row and its claim, message.py) is a second copy only of another wake's: the
copy of the last wake goes on as any redelivery does, and one whose wake still holds the row's
lease waits until that wake deleted the row (or, its waker dead, the lease ran out and the
row can be taken over).

Attempts: a retry is a new message with the task's id and a higher ``retries``, so one task id
may meet a row of another attempt of it. A later attempt exists only once an earlier one ran:
an earlier attempt denied while a later one waits is acked unrun, and a later one denied while
an earlier one waits (a stale copy, parked after it ran: twins.py) takes that row's place, so
that neither the retry is taken for a redelivery of the stored row (and lost) nor the earlier
attempt woken to run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..admission.base import AdmissionBackend
from ..errors import FlowControlError
from ..parked_state import ParkedStates
from ..parking import ParkedMessage, ParkingRejectedError, ParkingStore
from ..parking.wakes import Wake
from ..protocol import ticket_id
from ..reasons import DeadReason
from .crashpoints import crashpoint
from .delivery import Delivery
from .ledger import Entry
from .message import parked_of, woken_from
from .quarantine import Quarantine

logger = logging.getLogger(__name__)


class Wakes(Protocol):
    """Told of each row committed here (the waker: it wakes the row when its grant came first,
    or when it is due)."""

    def parked(self, row: ParkedMessage) -> None:
        """*row* is committed and its message acked."""


class Parker:
    """Parks the denied messages of one worker instance, and dead-letters what can't wait."""

    def __init__(self, *, store: ParkingStore, backend: AdmissionBackend, wakes: Wakes,
                 clock: Callable[[], float], quarantine: Quarantine,
                 states: ParkedStates | None = None) -> None:
        self.store = store
        self.states = states
        self.backend = backend
        self.wakes = wakes
        self.clock = clock
        self.parked = 0
        self.quarantine = quarantine  # the one the waker's wakes use too (runtime.py)

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
            stored = self._park_once(parked, _again(message, headers))
            if stored is None:
                logger.info("flowcontrol: task %s is delivered again after its parked row was "
                            "woken, or after a later attempt of it; that one runs, this one is "
                            "acked", task_id)
                ack()  # a woken copy of its row, or a later attempt, is the one to run
                return True
            if not stored:
                # The republished copy of a row a waker has not deleted yet: acking it now
                # would let that delete lose the message.
                return False
        except ParkingRejectedError as exc:
            # Not an outage: this message can never be parked. Kept where operators see it
            # rather than looped on.
            self.dead_letter(parked, DeadReason.PARK_REJECTED, exc)
            ack()  # only now: it is kept in the dead-letter table
            return True
        crashpoint("park.committed")
        ack()  # only now: the row is committed
        crashpoint("park.acked")
        self.stored(parked)
        self.committed([parked])
        return True

    def committed(self, rows: list[ParkedMessage]) -> None:
        """*rows* are committed and acked: their ``PARKED`` state, if tracked (..parked_state.py)."""
        if self.states is not None:
            self.states.committed(rows, self.clock())

    def stored(self, row: ParkedMessage) -> None:
        """*row* is committed and its message acked (here or in a batch, parkbatch.py): count
        it, and let the waker wake it when its grant came first or it is due."""
        self.parked += 1
        self.wakes.parked(row)

    def dead_letter(self, row: ParkedMessage, reason: DeadReason, error: BaseException) -> None:
        """Keep *row* (a message never parked) in the dead-letter table for *reason*, and take
        its ticket out of line (quarantine.py); a database outage raises."""
        self.quarantine.put(row, reason, error)

    def adopt(self, d: Delivery, entries: list[Entry]) -> bool | None:
        """*d*, delivered again by the broker, is admitted to run (holding *entries*): if the
        row it was parked as still waits (the node died between the park's commit and its
        ack), take the row out, so that the two are one run. ``False`` if a waker leased that
        row or woke it since (module docstring): its woken copy is the one to run, so *d*
        gives its slots back and is acked unrun. ``None`` if *d* is the copy the wake holding
        the row's lease published: that wake either deletes the row now or, its waker dead,
        lets the lease run out; *d* gives its slots back and is decided again later."""
        again = _again(d.message, d.headers)
        if again is None:
            return True  # a first delivery was never parked: nothing to read
        ticket, wake = again
        for _ in range(3):
            held = self.store.get(d.task_id)
            if held is None:
                last = self.store.wakes.last(d.task_id)  # after the read: a delete is seen here
                if last is not None and last[0] == ticket and last[1] != wake:
                    return self._duplicate(d, entries, "was woken")
                return True  # never parked, or not woken since (an operator's purge)
            if ticket_id(held.headers) != ticket:
                return True  # another run of the task (a retry): not this one's
            if (held.claimed_until or 0.0) > self.clock():
                if (held.seq, held.attempts) == wake:
                    self._give_back(entries)
                    return None  # its own wake is not finished: look again later
                # Leased by a waker: its copy is published, or will be once the lease runs out.
                return self._duplicate(d, entries, "is being woken")
            if self.store.claim(d.task_id) is not None:
                self.store.done([d.task_id])
                logger.info("flowcontrol: task %s is delivered again and admitted; its parked row "
                            "is taken out, so it runs once", d.task_id)
                return True
            # Leased (or gone) since the read: look again.
        self._give_back(entries)
        return None

    def _duplicate(self, d: Delivery, entries: list[Entry], what: str) -> bool:
        """*d* is a second copy of a row a waker woke: give back *entries*' slots and ack it
        unrun (the woken copy runs)."""
        logger.info("flowcontrol: task %s is delivered again while its parked row %s; the "
                    "woken copy runs", d.task_id, what)
        self._give_back(entries)
        d.ack()
        return False

    def _give_back(self, entries: list[Entry]) -> None:
        for entry in entries:
            try:
                self.backend.release(entry.slot.slot_id)
            except FlowControlError:
                pass  # held by no task here: the ledger check of reassert.py frees it

    def _take_out(self, row: ParkedMessage) -> None:
        """Delete *row*, the waiting row of an earlier attempt of its task, whose later attempt
        is being parked: that earlier one ran already (a copy of it did), and woken it would
        run again. Its ticket leaves the line; a row leased meanwhile is left to its waker."""
        taken = self.store.claim(row.task_id)
        if taken is None:
            return
        if taken.seq != row.seq:
            self.store.unclaim([taken.task_id])  # not the row read: decided again
            return
        self.store.done([row.task_id])
        logger.warning("flowcontrol: task %s: a later attempt is parked over the waiting row of "
                       "an earlier one (%s), which ran already; that row is dropped",
                       row.task_id, ticket_id(row.headers))
        try:
            self.backend.withdraw(row.queue, ticket_id(row.headers))
        except FlowControlError:
            pass  # not waiting there (or not registered): nothing to take out of line

    def _park_once(self, parked: ParkedMessage, again: tuple[str, Wake | None] | None) -> bool | None:
        """Store *parked* unless its row is already stored; False if the row is one a waker
        is republishing right now (this message may be its copy: it must not be acked yet).
        For a message the broker delivered *again* (its ticket, and the wake that published
        it): None if a copy another wake published is the one to run."""
        for _ in range(3):
            stored = self.store.park(parked) if again is None else self.store.wakes.park_again(parked, *again)
            if stored is not False:
                return stored
            row = self.store.get(parked.task_id)
            if row is None:
                continue  # the waker deleted the row this copy came from: store it again
            if not (row.claimed_until or 0.0) > self.clock():
                if ticket_id(row.headers) == ticket_id(parked.headers):
                    # A waiting row: a redelivery of what is stored already (acking is safe).
                    return True
                # Another attempt of the task waits (module docstring: attempts).
                if _retries(parked.headers) < _retries(row.headers):
                    return None  # this earlier one ran already: a later one exists
                self._take_out(row)  # that earlier one ran already: this later one exists
                continue
            if again is not None and ticket_id(row.headers) == again[0] and (row.seq, row.attempts) != again[1]:
                return None  # leased by another wake than the one that sent it: that copy runs
            return False  # a waker holds its lease: this may be its copy
        return False


def _retries(headers: dict[str, Any]) -> int:
    retries = headers.get("retries")
    return retries if isinstance(retries, int) and not isinstance(retries, bool) else 0


def _again(message: Any, headers: dict[str, Any]) -> tuple[str, Wake | None] | None:
    """For a message the broker delivered again: its ticket, and the wake that published it
    (None if no waker did); None for a first delivery."""
    if not (message.delivery_info or {}).get("redelivered"):
        return None
    return ticket_id(headers), woken_from(headers)
