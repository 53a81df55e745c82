"""Dead letters brought back: a dead letter parked anew, due at once, for the waker to publish.

A message lands in ``flowcontrol_dead`` when it could never succeed by trying again as things
stood (the parking table refused it, its wake could not be published, its cost is above every
limit). Once an operator has fixed the cause (a queue raised, an exchange declared again), the
letter is requeued: its message goes back into ``flowcontrol_parked`` as a row due now, and
the next poll of any worker (or beat's ``wake_due``) publishes it like any due row. Its task
then meets admission as a fresh arrival does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from sqlalchemy import Connection, delete, func, select

from ..errors import UnknownDeadLetterError
from .model import Requeue
from .rows import RowError, dead_letter_of, rejected_as, row_values
from .store import DEAD, ParkingStore

__all__ = ["REQUEUED", "DeadLetterTable"]

#: The ``reason`` of a row parked anew from the dead-letter table.
REQUEUED = "requeued"


class DeadLetterTable:
    """The dead letters of one parking store, counted and requeued (``ParkingStore`` lists
    them and adds to them)."""

    def __init__(self, store: ParkingStore) -> None:
        self.store = store

    def count(self, queue: str | None = None) -> int:
        """How many dead letters there are (of *queue*, or of every queue)."""
        stmt = select(func.count()).select_from(DEAD)
        if queue is not None:
            stmt = stmt.where(DEAD.c.queue == queue)
        return int(self.store.db.run(lambda conn: conn.execute(stmt).scalar_one(), read_only=True))

    def requeue(self, ids: Iterable[int] | None = None, *, queue: str | None = None,
                now: float | None = None) -> list[Requeue]:
        """Park dead letters anew, due at *now* (default: the store's clock): those of *ids*,
        else those of *queue*, else every one; oldest first, one :class:`Requeue` each.

        One transaction: each row parked is deleted from the dead-letter table with it, so a
        crash requeues a letter wholly or not at all. A letter whose task id is parked already,
        or whose message the table can't hold (a ``park-rejected`` letter), stays there, with
        the reason. An id not in the table is :class:`UnknownDeadLetterError`, raised before
        anything is written.
        """
        at = self.store.clock() if now is None else float(now)
        wanted = None if ids is None else sorted({int(i) for i in ids})
        stmt = select(DEAD).order_by(DEAD.c.id)
        if wanted is not None:
            stmt = stmt.where(DEAD.c.id.in_(wanted))
        elif queue is not None:
            stmt = stmt.where(DEAD.c.queue == queue)

        def op(conn: Connection) -> list[Requeue]:
            letters = [dead_letter_of(row._mapping) for row in conn.execute(stmt)]
            missing = sorted(set(wanted or ()) - {d.id for d in letters})
            if missing:
                raise UnknownDeadLetterError(missing)
            sql = self.store.db.sql(conn)
            out = []
            for d in letters:
                fresh = replace(d.message, wake_at=at, parked_at=None, reason=REQUEUED, attempts=0)
                try:
                    values = row_values(fresh, parked_at=at)
                except RowError as exc:
                    out.append(Requeue(d, f"can't be parked: field {exc.field!r}: {exc.detail}"))
                    continue
                result = conn.execute(sql.park, values)
                parked = result.first() is not None if sql.park_returns else result.rowcount == 1
                if not parked:
                    out.append(Requeue(d, f"task {d.task_id} is parked already"))
                    continue
                conn.execute(delete(DEAD).where(DEAD.c.id == d.id))
                out.append(Requeue(d))
            return out

        with rejected_as(None):
            return self.store.db.run(op, atomic=True)
