"""Debounced calls in the parking table: a burst's pending call is one parked row.

A debounced task's first call of a burst is parked as an ordinary row (reason
:data:`DEBOUNCE`) that wakes when the burst is due; each later call of the burst replaces
that row's body and argument headers and moves its ``wake_at`` (:meth:`DebounceRows.replace`),
in one transaction that skips a row a waker has leased: a leased row is on its way to the
broker, so its burst has fired and the caller starts a new one. Durable as any parked row: a
restart of every worker loses no pending call, and any waker (or beat's ``wake_due``)
publishes it when due.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection, or_, select, update

from ..reasons import Reason
from .model import ParkedMessage, decode_json, encode_json
from .rows import message_of
from .statements import PARKED
from .store import ParkingStore

__all__ = ["DEBOUNCE", "DebounceRows"]

#: The ``reason`` of a parked row that is a burst's pending call.
DEBOUNCE = Reason.DEBOUNCE.value


class DebounceRows:
    """The pending debounced calls of one parking store."""

    def __init__(self, store: ParkingStore) -> None:
        self.store = store

    def park(self, message: ParkedMessage) -> bool:
        """Park a burst's first call (committed durably); False if its task id is parked."""
        return self.store.park(message)

    def replace(self, task_id: str, body: bytes, headers: Mapping[str, Any],
                wake_of: Callable[[dict[str, Any]], float], now: float) -> float | None:
        """Make parked *task_id* carry a later call: its *body*, *headers* merged over the
        row's, and ``wake_at = wake_of(merged headers)``. The new ``wake_at``, or ``None`` if
        the row is gone or leased by a waker (its burst has fired)."""
        c = PARKED.c
        free = or_(c.claimed_until.is_(None), c.claimed_until <= now)

        def op(conn: Connection) -> float | None:
            # FOR UPDATE: a PostgreSQL claimer (SKIP LOCKED) passes over the row until this
            # commits; SQLite runs the whole transaction as its one writer.
            row = conn.execute(select(c.headers).where(c.task_id == task_id, free)
                               .with_for_update()).first()
            if row is None:
                return None
            merged = {**decode_json(row[0]), **headers}
            wake = float(wake_of(merged))
            done = conn.execute(update(PARKED).where(c.task_id == task_id, free).values(
                body=bytes(body), headers=encode_json(merged), wake_at=wake)).rowcount
            return wake if done == 1 else None

        return self.store.db.run(op, atomic=True)

    def discard(self, task_id: str) -> bool:
        """Remove a pending call that another burst took over (never published)."""
        return self.store.delete(task_id)

    def pending(self, limit: int = 100) -> list[ParkedMessage]:
        """Up to *limit* pending debounced calls, the soonest due first."""
        stmt = (select(PARKED).where(PARKED.c.reason == DEBOUNCE)
                .order_by(PARKED.c.wake_at, PARKED.c.seq).limit(limit))
        return self.store.db.run(
            lambda conn: [message_of(row._mapping) for row in conn.execute(stmt)],
            read_only=True)
