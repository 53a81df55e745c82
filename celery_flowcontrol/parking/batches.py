"""Batched calls in the parking table: each call is a parked row until a batch takes it.

A call of a ``flow_batch`` task is parked (reason :data:`BATCH_CALL`) in a *gathering*
queue named after its task and batch key (:func:`gathering`), never due, so no waker
publishes it. A batch is a parked row of its own (reason :data:`BATCH`): the task's
message with no calls in it, due ``wait`` after the batch's first call, or at once when
``size`` calls wait. When its run starts, :meth:`BatchRows.take` moves at most ``size``
of the oldest waiting calls into the batch (their queue becomes :func:`taken_by` the
batch's id), in one transaction that skips rows another transaction holds (PostgreSQL
``FOR UPDATE SKIP LOCKED``; SQLite runs it as its one writer): a call is in exactly one
batch. A run that starts again (a redelivery after its worker died) takes the calls its
batch took before, and no others. The rows go when the batch has stored every call's
result (:meth:`BatchRows.finish`).
"""

from __future__ import annotations

from sqlalchemy import Connection, delete, func, select, update

from ..reasons import Reason
from .model import ParkedMessage
from .rows import message_of
from .statements import PARKED
from .store import ParkingStore

__all__ = ["BATCH", "BATCH_CALL", "NEVER", "BatchRows", "gathering", "taken_by"]

#: The ``reason`` of a parked row that is a batch's run, and of a call waiting for one.
BATCH = Reason.BATCH.value
BATCH_CALL = "batch-call"  # told apart in the table; explain and the PARKED meta say "batch"
#: ``wake_at`` of a waiting call: no waker ever finds it due.
NEVER = 4_000_000_000.0


def gathering(key: str) -> str:
    """The parking queue of the calls waiting for a batch of batch key *key*."""
    return f"flowcontrol.batch:{key}"


def taken_by(batch_id: str) -> str:
    """The parking queue of the calls batch *batch_id* took."""
    return f"flowcontrol.batched:{batch_id}"


class BatchRows:
    """The batched calls of one parking store."""

    def __init__(self, store: ParkingStore) -> None:
        self.store = store

    def waiting(self, key: str) -> int:
        """How many calls of batch key *key* wait for a batch."""
        stmt = select(func.count()).select_from(PARKED).where(PARKED.c.queue == gathering(key))
        return int(self.store.db.run(lambda conn: conn.execute(stmt).scalar() or 0,
                                     read_only=True))

    def oldest(self, key: str) -> float | None:
        """When the oldest waiting call of *key* was parked; ``None``: none waits."""
        stmt = select(func.min(PARKED.c.parked_at)).where(PARKED.c.queue == gathering(key))
        value = self.store.db.run(lambda conn: conn.execute(stmt).scalar(), read_only=True)
        return None if value is None else float(value)

    def first(self, key: str) -> ParkedMessage | None:
        """The oldest call of batch key *key* waiting for a batch, or ``None``."""
        c = PARKED.c
        stmt = select(PARKED).where(c.queue == gathering(key)).order_by(c.seq).limit(1)

        def op(conn: Connection) -> ParkedMessage | None:
            row = conn.execute(stmt).first()
            return None if row is None else message_of(row._mapping)

        return self.store.db.run(op, read_only=True)

    def take(self, batch_id: str, key: str, size: int) -> list[ParkedMessage]:
        """The calls of batch *batch_id*: those it took before (a run started again), else
        at most *size* of the oldest waiting calls of *key*, moved into the batch at once."""
        c = PARKED.c
        mine = select(PARKED).where(c.queue == taken_by(batch_id)).order_by(c.seq)

        def op(conn: Connection) -> list[ParkedMessage]:
            rows = [message_of(r._mapping) for r in conn.execute(mine)]
            if rows:
                return rows
            pick = (select(c.seq).where(c.queue == gathering(key)).order_by(c.seq)
                    .limit(size))
            if self.store.db.skip_locked:
                pick = pick.with_for_update(skip_locked=True)
            seqs = [r[0] for r in conn.execute(pick)]
            if not seqs:
                return []
            conn.execute(update(PARKED).where(c.seq.in_(seqs), c.queue == gathering(key))
                         .values(queue=taken_by(batch_id)))
            return [message_of(r._mapping) for r in conn.execute(mine)]

        return self.store.db.run(op, atomic=True)

    def finish(self, batch_id: str) -> int:
        """Remove the calls of batch *batch_id* (every result is stored)."""
        stmt = delete(PARKED).where(PARKED.c.queue == taken_by(batch_id))
        return int(self.store.db.run(lambda conn: conn.execute(stmt).rowcount, atomic=True))

    def coming(self, now: float, until: float, limit: int = 1000) -> list[tuple[str, float]]:
        """Batches due after *now* and by *until*, not being woken: ``(task id, wake_at)``,
        soonest first. A producer parks a batch, so no worker knows when it comes due but by
        this look (worker/waker.py remembers them on its timer, worker/waking.py)."""
        c = PARKED.c
        stmt = (select(c.task_id, c.wake_at)
                .where(c.wake_at > now, c.wake_at <= until, c.reason == BATCH,
                       c.claimed_until.is_(None))
                .order_by(c.wake_at).limit(limit))
        return self.store.db.run(
            lambda conn: [(str(t), float(w)) for t, w in conn.execute(stmt)], read_only=True)

    def gathering_keys(self, limit: int = 100) -> list[tuple[str, int, float]]:
        """Batch keys with calls waiting: ``(key, calls, oldest parked_at)``, oldest first."""
        c = PARKED.c
        prefix = gathering("")
        stmt = (select(c.queue, func.count(), func.min(c.parked_at))
                .where(c.reason == BATCH_CALL, c.queue.startswith(prefix))
                .group_by(c.queue).order_by(func.min(c.parked_at)).limit(limit))
        return self.store.db.run(
            lambda conn: [(q[len(prefix):], int(n), float(t or 0.0))
                          for q, n, t in conn.execute(stmt)], read_only=True)
