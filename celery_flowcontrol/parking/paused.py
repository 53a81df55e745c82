"""The rows a pause parked (reason ``paused``), made due when the pause is lifted.

``resume`` (tenants.py) wakes the calls its pause held through :meth:`PausedRows.wake`: a grant
wakes a waiter of a queue with a cap, but an uncapped queue (rate-only, keyed) has no slots to
grant, and its rows would wait until the pause's end. One UPDATE on the queue/``wake_at``
index, committed durably; the workers' poll then wakes the rows.
"""

from __future__ import annotations

from sqlalchemy import update

from ..reasons import Reason
from .rows import finite
from .statements import PARKED
from .store import ParkingStore

__all__ = ["PausedRows"]


class PausedRows:
    """The ``paused`` rows of one parking store."""

    def __init__(self, store: ParkingStore) -> None:
        self.store = store

    def wake(self, queue: str, key: str | None = None, now: float | None = None) -> int:
        """Make the rows of *queue* parked ``paused`` (only fairness key *key*'s, if given)
        due at *now* (default: the store's clock), so that the next poll wakes them; the
        number of rows moved."""
        at = self.store.clock() if now is None else finite(now)
        c = PARKED.c
        match = [c.queue == queue, c.reason == Reason.PAUSED.value, c.wake_at > at]
        if key is not None:
            match.append(c.fairness_key == key)
        stmt = update(PARKED).where(*match).values(wake_at=at)
        return int(self.store.db.run(lambda conn: conn.execute(stmt).rowcount))
