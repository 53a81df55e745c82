"""ParkingStore: park denied messages in SQL, claim them when due, delete them once republished.

Features
    ``park`` commits one row per task id (a redelivery parks once) before the caller acks;
    ``park_many`` commits several in one transaction (a worker's denials of one turn).
    ``claim_due`` / ``claim`` take a lease on rows (``claimed_until``) so two wakers never
    republish the same row at once; a crashed waker's lease simply runs out. ``wakes``
    (wakes.py) deletes the rows whose copies were published and remembers each wake as its
    task id's last (``flowcontrol_woken``, for ``woken_keep``), which a message delivered
    again after its node died between a park's commit and its ack reads. Each
    operation is one prebuilt SQL statement (``done``/``unclaim``: one per task id) in its own short
    transaction: PostgreSQL runs it in autocommit and claims with ``FOR UPDATE SKIP LOCKED``
    (concurrent claimers skip each other's rows instead of queueing), SQLite under
    ``BEGIN IMMEDIATE`` (one writer at a time). On these two databases the hot path runs on the
    driver's connection (fastpath.py); others use SQLAlchemy Core throughout.
    benchmarks/parking.py measures park + claim_due + done against one plain insert per
    transaction; fastpath.py says why the due claim runs on a pool of its own.

Connection
    Any SQLAlchemy URL; SQLite (``sqlite:///flowcontrol.sqlite3``) and PostgreSQL are tested.
    No connection is opened before the first operation. SQLite tables are created on first use;
    other databases need :func:`celery_flowcontrol.parking.migrate` (or ``create=True``).

Options
    ``claim_lease`` (30 s): how long a claim keeps a row from other wakers.
    ``durable_wake`` (False): durability of the writes after ``park``. ``park``, ``park_many``,
    ``reschedule``, ``delete`` and ``dead_letter`` (and ``PausedRows.wake``, paused.py) always
    commit durably (SQLite ``synchronous=FULL``, PostgreSQL ``synchronous_commit=on``): once
    ``park`` returns, the message survives a power loss and may be acked. A claim's lease and
    the delete in ``done`` or ``wakes.record`` (with its record of the wake) only decide
    whether a row may be woken *again*, so by default they commit without waiting for the
    disk: a crash of the database host may bring back a row that was already republished,
    and it is then woken twice (at-least-once, as when a broker loses an ack), never lost.
    ``durable_wake=True`` makes ``done``, ``wakes.record`` and ``unclaim``
    durable too, at about one more disk flush per wake.
    ``timeout`` (10 s): how long an operation waits for a connection (PostgreSQL) or for another
    writer (SQLite) before it fails with ``ParkingUnavailableError``.
    ``clock`` (``time.time``): the default ``now``.
    ``woken_keep`` (3600 s, the Redis transport's default ``visibility_timeout``): how long a
    woken row is remembered (``wakes.forget``).

Errors
    :class:`~celery_flowcontrol.errors.ParkingUnavailableError` when the database can't be
    reached or used (the caller must not ack); :class:`ParkingRejectedError` when this message
    can never be stored (a value too long or of the wrong type): dead-letter it instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Table, delete, func, insert, inspect, select, update
from sqlalchemy.exc import DataError, IntegrityError

from ..errors import ParkingRejectedError
from .database import Database
from .engine import parking_url
from .model import DeadLetter, DeadRow, ParkedMessage
from .rows import RowError, dead_letter_of, dead_values, finite, message_of, rejected_as, row_values
from .statements import PARKED, WOKEN, chunks, inserted
from .wakes import Wakes

__all__ = ["ParkingRejectedError", "ParkingStore"]

T = TypeVar("T")
# Aliases: inside ParkingStore the name ``list`` is the method.
Messages = list[ParkedMessage]
DeadLetters = list[DeadLetter]

# Declarative models type __table__ as a FromClause; it is a Table.
DEAD = cast(Table, DeadRow.__table__)


class ParkingStore:
    """The parking table of one database (see the module docstring). Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        create: bool | None = None,
        clock: Callable[[], float] = time.time,
        claim_lease: float = 30.0,
        durable_wake: bool = False,
        timeout: float = 10.0,
        woken_keep: float = 3600.0,
    ) -> None:
        self.url = parking_url(url)
        self.dialect = self.url.get_backend_name()
        self.clock = clock
        self.claim_lease = float(claim_lease)
        self.durable_wake = durable_wake
        self.woken_keep = float(woken_keep)
        self.create = self.dialect == "sqlite" if create is None else create
        self.db = Database(self.url, create=self.create, timeout=float(timeout))
        #: The woken rows: each task id's last wake (wakes.py).
        self.wakes = Wakes(self)

    def __repr__(self) -> str:
        return f"<ParkingStore {self.url.render_as_string(hide_password=True)}>"

    # -- writes ----------------------------------------------------------------------------

    def park(self, message: ParkedMessage) -> bool:
        """Store ``message`` and commit. True if parked now, False if its task id already was.

        Only after this returns may the caller ack the broker message.
        """
        try:
            values = row_values(message, parked_at=self.clock())
        except RowError as exc:
            task_id = message.task_id if isinstance(message.task_id, str) else None
            raise ParkingRejectedError(exc.detail, task_id, exc.field) from exc

        fast = self.db.fast(relaxed=False)
        try:
            with rejected_as(message.task_id):
                if fast is not None:
                    return self.db.retrying(lambda: fast.parked(values))
                return self.db.run(lambda conn: inserted(conn, self.db.sql(conn), values))
        except ParkingRejectedError as exc:
            # Dialects without ON CONFLICT DO NOTHING: a duplicate is an IntegrityError.
            if isinstance(exc.__cause__, IntegrityError) and self.get(message.task_id) is not None:
                return False
            raise

    def park_many(self, messages: Sequence[ParkedMessage]) -> list[bool | ParkingRejectedError]:
        """Store ``messages`` in one transaction, in their order (their arrival sequence follows
        it), and commit once. For each message: True if parked now, False if its task id already
        was (also by an earlier one of this batch), or the :class:`ParkingRejectedError` saying
        why it can never be stored. That one does not sink the others: caught by the checks, it
        is left out; refused by the database, it rolls the batch back, which is then parked one
        message at a time. An outage raises ``ParkingUnavailableError``, nothing committed.
        """
        results, rows = _checked(messages, self.clock())
        if not rows:
            return results
        fast, many = self.db.fast(relaxed=False), list(rows.values())
        stored: Sequence[bool | ParkingRejectedError]
        try:
            if fast is not None:
                stored = self.db.retrying(lambda: fast.parked_many(many))
            else:
                stored = self.db.run(lambda conn: [inserted(conn, self.db.sql(conn), v) for v in many], atomic=True)
        except (IntegrityError, DataError):  # a value refused, or (no ON CONFLICT) a duplicate
            stored = [_alone(self, messages[i]) for i in rows]
        for i, parked in zip(rows, stored, strict=True):
            results[i] = parked
        return results

    def claim_due(self, now: float | None = None, limit: int = 100) -> Messages:
        """Lease up to ``limit`` rows due at ``now`` that nobody holds; highest priority, then
        oldest first. Their ``claimed_until`` becomes ``now + claim_lease``."""
        at = self._now(now)
        if limit <= 0:
            return []
        return self._claim("claim_due", {"now": at, "limit": limit})

    def claim(self, task_id: str, now: float | None = None) -> ParkedMessage | None:
        """Lease one row, due or not (a grant wakes it early); None if absent or leased."""
        claimed = self._claim("claim_one", {"now": self._now(now), "limit": 1, "tid": task_id})
        return claimed[0] if claimed else None

    def claim_many(self, task_ids: Iterable[str], now: float | None = None) -> Messages:
        """Lease the rows of ``task_ids``, due or not, in one transaction (grants woken
        together); absent or leased ones are left out. Highest priority, then oldest first."""
        ids = _ids(task_ids)
        at = self._now(now)
        if len(ids) <= 1:
            claimed = self.claim(ids[0], at) if ids else None
            return [claimed] if claimed is not None else []
        fast = self.db.fast(relaxed=True)
        if fast is None:
            # One claim per id: the same leases, in one transaction each.
            return _by_rank([m for i in ids if (m := self.claim(i, at)) is not None])
        many = [{"now": at, "limit": 1, "tid": i, "until": at + self.claim_lease} for i in ids]
        rows = self.db.retrying(lambda: fast.rows_many(fast.claim_one, many))
        return _by_rank([message_of(row) for row in rows])

    def done(self, task_ids: Iterable[str] | str) -> int:
        """Delete rows whose messages were republished; returns how many were deleted."""
        return self._by_ids("done", _ids(task_ids), {})

    def unclaim(self, task_ids: Iterable[str] | str, wake_at: float | None = None) -> int:
        """Drop the lease of rows whose republish failed, optionally moving their ``wake_at``."""
        if wake_at is None:
            return self._by_ids("unclaim", _ids(task_ids), {})
        return self._by_ids("unclaim_at", _ids(task_ids), {"wake": finite(wake_at)})

    def reschedule(self, task_id: str, wake_at: float) -> bool:
        """Move a row's ``wake_at`` (its lease, if any, stays); False if there is no such row."""
        stmt = update(PARKED).where(PARKED.c.task_id == task_id).values(wake_at=finite(wake_at))
        return self.db.run(lambda conn: conn.execute(stmt).rowcount == 1)

    def delete(self, task_id: str) -> bool:
        """Remove a parked message without waking it (an operator's purge)."""
        stmt = delete(PARKED).where(PARKED.c.task_id == task_id)
        return self.db.run(lambda conn: conn.execute(stmt).rowcount == 1)

    def dead_letter(self, message: ParkedMessage, reason: str, error: str | BaseException) -> None:
        """Keep a message that can't be parked (``reason``: why, ``error``: the details).

        Never refuses a value: over-long or odd text is stored as is, in unbounded columns;
        fields a database can't hold (NUL characters, lone surrogates) are escaped.
        """
        values = dead_values(message, reason, error, self.clock())
        with rejected_as(str(message.task_id)):
            self.db.run(lambda conn: conn.execute(insert(DEAD), values))

    # -- reads -------------------------------------------------------------------------------

    def get(self, task_id: str) -> ParkedMessage | None:
        """The parked message with this task id, or None."""
        stmt = select(PARKED).where(PARKED.c.task_id == task_id)
        row = self.db.run(lambda conn: conn.execute(stmt).first(), read_only=True)
        return None if row is None else message_of(row._mapping)

    def waiting(self, task_id: str, now: float | None = None) -> bool:
        """True if *task_id* has a parked row that no waker holds at *now* (one that waits to
        be woken, not one being republished). Read on the worker's deny path, so on the
        driver where the fast path runs: a SQLAlchemy ``get`` cost that path about as much as
        an admission round trip."""
        at = self._now(now)
        fast = self.db.fast(relaxed=True)
        if fast is not None:
            rows = self.db.retrying(lambda: fast.read(fast.lease_one, {"tid": task_id}))
        else:
            stmt = select(PARKED.c.claimed_until).where(PARKED.c.task_id == task_id)
            rows = self.db.run(lambda conn: list(conn.execute(stmt)), read_only=True)
        return bool(rows) and not (rows[0][0] or 0.0) > at

    def list(self, queue: str, limit: int = 50) -> Messages:
        """Up to ``limit`` messages of ``queue`` in wake order (``wake_at``, priority, arrival)."""
        stmt = (
            select(PARKED)
            .where(PARKED.c.queue == queue)
            .order_by(PARKED.c.wake_at, PARKED.c.priority.desc(), PARKED.c.seq)
            .limit(limit)
        )
        return self.db.run(lambda conn: [message_of(row._mapping) for row in conn.execute(stmt)], read_only=True)

    def count(self, queue: str | None = None) -> int:
        """How many messages are parked (in ``queue``, or in all queues)."""
        stmt = select(func.count()).select_from(PARKED)
        if queue is not None:
            stmt = stmt.where(PARKED.c.queue == queue)
        return int(self.db.run(lambda conn: conn.execute(stmt).scalar_one(), read_only=True))

    def counts(self) -> dict[str, int]:
        """Parked messages per queue (queues with none are absent)."""
        stmt = select(PARKED.c.queue, func.count()).group_by(PARKED.c.queue).order_by(PARKED.c.queue)
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), read_only=True)
        return {queue: int(n) for queue, n in rows}

    def dead_counts(self) -> dict[str, int]:
        """Dead letters per reason (``park-rejected``, ``wake-failed``...); none: empty."""
        stmt = select(DEAD.c.reason, func.count()).group_by(DEAD.c.reason).order_by(DEAD.c.reason)
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), read_only=True)
        return {reason: int(n) for reason, n in rows}

    def dead_letters(self, limit: int = 50, queue: str | None = None) -> DeadLetters:
        """The ``limit`` newest dead letters (of ``queue``, or of all queues), newest first."""
        stmt = select(DEAD).order_by(DEAD.c.id.desc()).limit(limit)
        if queue is not None:
            stmt = stmt.where(DEAD.c.queue == queue)
        return self.db.run(lambda conn: [dead_letter_of(row._mapping) for row in conn.execute(stmt)], read_only=True)

    def missing_tables(self) -> Sequence[str]:
        """The parking tables the database lacks (none once migrated, or created: ``create``).

        :raises ParkingUnavailableError: the database can't be reached.
        """
        wanted = [PARKED.name, DEAD.name, WOKEN.name]
        return self.db.run(lambda conn: [t for t in wanted if not inspect(conn).has_table(t)],
                           read_only=True)

    def close(self) -> None:
        """Close the pooled connections; the store reconnects if used again."""
        self.db.close()

    # -- internals ---------------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else finite(now)

    def _claim(self, which: str, params: dict[str, Any]) -> Messages:
        until = params["now"] + self.claim_lease
        fast = self.db.fast(relaxed=True)
        if fast is not None:
            rows = self.db.retrying(lambda: fast.rows(getattr(fast, which), {**params, "until": until}))
            return _by_rank([message_of(row) for row in rows])

        def op(conn: Connection) -> Messages:
            sql = self.db.sql(conn)
            stmt = getattr(sql, which)
            if sql.returning:
                return _by_rank([message_of(row._mapping) for row in conn.execute(stmt, {**params, "until": until})])
            # No UPDATE ... RETURNING: select (rows locked, or SQLite's write lock held), then update.
            rows = [message_of(row._mapping) for row in conn.execute(stmt, params)]
            if rows:
                conn.execute(sql.lease, {"seqs": [m.seq for m in rows], "until": until})
            return [replace(m, claimed_until=until, attempts=m.attempts + 1) for m in rows]

        return self.db.run(op, relaxed=True, atomic=True)

    def _by_ids(self, which: str, ids: Sequence[str], params: dict[str, Any]) -> int:
        """``done``, ``unclaim`` or ``unclaim_at`` for every task id in ``ids``; rows changed."""
        if not ids:
            return 0
        relaxed = not self.durable_wake
        fast = self.db.fast(relaxed)
        if fast is not None:
            # One statement per id, in one executemany: no SQL to build per batch size.
            one = getattr(fast, f"{which}_one")
            return self.db.retrying(lambda: fast.count(one, [{**params, "tid": i} for i in ids]))

        def op(conn: Connection) -> int:
            stmt = getattr(self.db.sql(conn), which)
            return sum(conn.execute(stmt, {**params, "ids": chunk}).rowcount for chunk in chunks(ids))

        return self.db.run(op, relaxed=relaxed)


# -- helpers -----------------------------------------------------------------------------------


def _checked(messages: Sequence[ParkedMessage], now: float) -> tuple[list[bool | ParkingRejectedError],
                                                                     dict[int, dict[str, Any]]]:
    """For ``park_many``: each message's result so far (False, or why the store's checks reject
    it), and the row values of those to insert, by position."""
    results: list[bool | ParkingRejectedError] = []
    rows: dict[int, dict[str, Any]] = {}
    for i, message in enumerate(messages):
        try:
            rows[i] = row_values(message, parked_at=now)
            results.append(False)
        except RowError as exc:
            task_id = message.task_id if isinstance(message.task_id, str) else None
            results.append(ParkingRejectedError(exc.detail, task_id, exc.field))
    return results, rows


def _alone(store: ParkingStore, message: ParkedMessage) -> bool | ParkingRejectedError:
    """For ``park_many``: park *message* by itself; why it can't be, rather than raise."""
    try:
        return store.park(message)
    except ParkingRejectedError as exc:
        return exc


def _by_rank(claimed: Messages) -> Messages:
    # RETURNING gives rows in no particular order; claims come highest priority, then oldest first.
    return sorted(claimed, key=lambda m: (-m.priority, m.seq or 0))


def _ids(task_ids: Iterable[str] | str) -> list[str]:
    return [task_ids] if isinstance(task_ids, str) else list(dict.fromkeys(task_ids))
