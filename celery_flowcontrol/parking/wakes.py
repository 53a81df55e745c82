"""The woken-row bookkeeping: which wake of a task id published it last (``flowcontrol_woken``).

A waker that published the copies of claimed rows deletes the rows and remembers each wake as
its task id's last (:meth:`Wakes.record`; a wake is the row's ``seq`` and ``attempts``, with the
ticket it was published under). A message the broker delivers again after its node died
between a park's commit and its ack learns from it (:meth:`Wakes.last`, :meth:`Wakes.park_again`)
that the woken copy is the one to run (worker/park.py). Entries older than ``woken_keep`` are
forgotten (:meth:`Wakes.forget`, from the waker's chores).

Each store has one, as ``ParkingStore.wakes``, on the store's database, clock and options
(store.py's docstring: ``durable_wake``, ``woken_keep``), read from the store at each call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.exc import IntegrityError

from ..errors import ParkingRejectedError
from .database import Database
from .model import ParkedMessage
from .rows import RowError, finite, rejected_as, row_values
from .statements import PARKED, WOKEN, chunks, inserted

__all__ = ["Wake", "Wakes"]

#: One wake of a row: its ``seq`` and its claims so far (``attempts``, the wake's own claim
#: included).
Wake = tuple[int, int]


class Store(Protocol):
    """What :class:`Wakes` reads of its ``ParkingStore``."""

    db: Database
    clock: Callable[[], float]
    durable_wake: bool
    woken_keep: float

    def get(self, task_id: str) -> ParkedMessage | None: ...


class Wakes:
    """The woken rows of one parking store (the module docstring). Thread-safe."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, messages: Sequence[ParkedMessage], tickets: Sequence[str]) -> int:
        """Delete the rows of claimed *messages* whose copies were published, and remember
        each wake as its task id's last (the row's ``seq`` and ``attempts``, and its ticket,
        *tickets* in the same order) before, or in the same transaction; how many rows were
        deleted."""
        if not messages:
            return 0
        ids = [m.task_id for m in messages]
        store = self.store
        now = store.clock()
        values = list({m.task_id: {"task_id": m.task_id, "ticket": ticket, "seq": m.seq or 0,
                                   "attempts": m.attempts, "woken_at": now}
                       for m, ticket in zip(messages, tickets, strict=True)}.values())

        relaxed = not store.durable_wake
        fast = store.db.fast(relaxed)
        if fast is not None:
            # Remembered first, then deleted: whoever finds a row gone finds it remembered.
            store.db.retrying(lambda: fast.count(fast.woken_one, values))
            return store.db.retrying(lambda: fast.count(fast.done_one, [{"tid": i} for i in ids]))

        def op(conn: Connection) -> int:
            for chunk in chunks(ids):
                conn.execute(delete(WOKEN).where(WOKEN.c.task_id.in_(chunk)))
            conn.execute(insert(WOKEN), values)
            return sum(conn.execute(delete(PARKED).where(PARKED.c.task_id.in_(chunk))).rowcount
                       for chunk in chunks(ids))

        return store.db.run(op, relaxed=relaxed, atomic=True)

    def last(self, task_id: str) -> tuple[str, Wake] | None:
        """The ticket and the wake (the row's ``seq`` and ``attempts``) of *task_id*'s last
        wake (within ``woken_keep``), or None."""
        stmt = select(WOKEN.c.ticket, WOKEN.c.seq, WOKEN.c.attempts).where(WOKEN.c.task_id == task_id)
        row = self.store.db.run(lambda conn: conn.execute(stmt).first(), read_only=True)
        return None if row is None else (str(row[0]), (int(row[1]), int(row[2])))

    def park_again(self, message: ParkedMessage, ticket: str, wake: Wake | None) -> bool | None:
        """``ParkingStore.park`` for a message the broker delivered again (*ticket* its
        ticket, *wake* the wake that published it, if one did): True if parked now, False if
        its task id is parked already, None if it is not stored because a copy woken since is
        the one to run (the last wake of its task id has its ticket and is another wake). The
        insert and that look are one transaction, so a waker that deletes the row meanwhile is
        seen by one or the other."""
        store = self.store
        try:
            values = row_values(message, parked_at=store.clock())
        except RowError as exc:
            task_id = message.task_id if isinstance(message.task_id, str) else None
            raise ParkingRejectedError(exc.detail, task_id, exc.field) from exc
        last = select(WOKEN.c.ticket, WOKEN.c.seq, WOKEN.c.attempts).where(WOKEN.c.task_id == message.task_id)

        def op(conn: Connection) -> bool | None:
            if not inserted(conn, store.db.sql(conn), values):
                return False
            woken = conn.execute(last).first()
            if woken is not None and woken[0] == ticket and (woken[1], woken[2]) != wake:
                conn.execute(delete(PARKED).where(PARKED.c.task_id == message.task_id))
                return None
            return True

        try:
            with rejected_as(message.task_id):
                return store.db.run(op, atomic=True)
        except ParkingRejectedError as exc:
            if isinstance(exc.__cause__, IntegrityError) and store.get(message.task_id) is not None:
                return False
            raise

    def forget(self, now: float | None = None) -> int:
        """Forget the woken rows older than ``woken_keep``; how many."""
        store = self.store
        at = store.clock() if now is None else finite(now)
        stmt = delete(WOKEN).where(WOKEN.c.woken_at < at - store.woken_keep)
        return int(store.db.run(lambda conn: conn.execute(stmt).rowcount, relaxed=True))
