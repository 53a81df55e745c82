"""The store's SQL, built once per dialect with bound parameters.

Building a SQLAlchemy statement costs more Python than running a small one on SQLite, so the hot
path (park, claim, done) executes these prebuilt objects; SQLAlchemy's compiled cache then maps
each to its SQL string with no further work.

Parameters: ``now`` and ``until`` (epoch seconds: the claim time and the new lease's end),
``limit``, ``tid`` (a task id), ``ids`` and ``seqs`` (lists, expanded into ``IN (...)``), ``wake``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Connection,
    Double,
    Integer,
    Table,
    any_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)

from .model import ParkedRow, WokenRow

__all__ = ["CHUNK", "PARKED", "WOKEN", "Statements", "chunks", "inserted", "statements"]

# Declarative models type __table__ as a FromClause; it is a Table.
PARKED = cast(Table, ParkedRow.__table__)
WOKEN = cast(Table, WokenRow.__table__)
_c = PARKED.c


@dataclass(frozen=True)
class Statements:
    """Every statement the store runs on ``flowcontrol_parked``, for one dialect."""

    #: Insert a row unless its task id is parked; returns ``seq`` when ``park_returns``.
    park: Any
    park_returns: bool
    #: ``returning``: UPDATE ... RETURNING the claimed rows (one statement). Otherwise SELECT
    #: the rows to claim (locked where the dialect can), then run ``lease`` on their ``seqs``.
    claim_due: Any
    claim_one: Any
    lease: Any
    returning: bool
    done: Any
    unclaim: Any
    unclaim_at: Any
    #: The same for one task id (``tid``), run once per id by the fast path (executemany).
    done_one: Any
    unclaim_one: Any
    unclaim_at_one: Any
    #: ``claimed_until`` of one task id's row (no row: no result), read on the gate's deny path.
    lease_one: Any
    #: Remember one wake in ``flowcontrol_woken`` (``task_id``, ``ticket``, ``seq``,
    #: ``attempts``, ``woken_at``), replacing its task id's last; None where the dialect has no
    #: upsert.
    woken_one: Any


def _free() -> Any:
    """Rows no live lease holds at ``now``."""
    return or_(_c.claimed_until.is_(None), _c.claimed_until <= bindparam("now", type_=Double()))


def _insert_ignoring_duplicates(dialect: str) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(PARKED).on_conflict_do_nothing(index_elements=["task_id"])
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(PARKED).on_conflict_do_nothing(index_elements=["task_id"])
    # Elsewhere a duplicate raises IntegrityError, and the store checks for the row.
    return insert(PARKED)


def _remember_woken(dialect: str) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    else:
        return None
    new = upsert(WOKEN)
    return new.on_conflict_do_update(index_elements=["task_id"], set_={
        "ticket": new.excluded.ticket, "seq": new.excluded.seq, "attempts": new.excluded.attempts,
        "woken_at": new.excluded.woken_at})


@cache
def statements(dialect: str, *, returning: bool, insert_returning: bool, skip_locked: bool) -> Statements:
    """The statements for ``dialect`` (a SQLAlchemy backend name) and its capabilities."""
    order = (_c.priority.desc(), _c.seq)
    due = _c.wake_at <= bindparam("now", type_=Double())
    one = _c.task_id == bindparam("tid")
    limit = bindparam("limit", type_=Integer())
    lease_values = {"claimed_until": bindparam("until", type_=Double()), "attempts": _c.attempts + 1}

    def pick(where: Any, columns: Any) -> Any:
        query = select(*columns).where(where, _free()).order_by(*order).limit(limit)
        # Concurrent claimers skip each other's rows instead of queueing behind them. SQLite has
        # no row locks (nor this clause): there, BEGIN IMMEDIATE makes claims take turns.
        return query.with_for_update(skip_locked=True) if skip_locked else query

    def claim(where: Any) -> Any:
        if not returning:
            return pick(where, PARKED.c)
        chosen = pick(where, [_c.seq])
        if dialect == "postgresql":
            # ``seq = ANY(ARRAY(SELECT ...))``: the pick runs once, as an InitPlan, and the update
            # finds its rows by primary key. ``seq IN (SELECT ...)`` plans a semi-join (hash
            # aggregate, nested loop) on every run (docs/parking.md).
            matched = _c.seq == any_(func.array(chosen.scalar_subquery()))
        else:
            matched = _c.seq.in_(chosen)
        return update(PARKED).where(matched).values(lease_values).returning(*PARKED.c)

    park = _insert_ignoring_duplicates(dialect)
    ids: BindParameter[list[str]] = bindparam("ids", expanding=True)
    wake: BindParameter[float] = bindparam("wake", type_=Double())
    return Statements(
        park=park.returning(_c.seq) if insert_returning else park,
        park_returns=insert_returning,
        claim_due=claim(due),
        claim_one=claim(one),
        lease=update(PARKED).where(_c.seq.in_(bindparam("seqs", expanding=True))).values(lease_values),
        returning=returning,
        done=delete(PARKED).where(_c.task_id.in_(ids)),
        unclaim=update(PARKED).where(_c.task_id.in_(ids)).values(claimed_until=None),
        unclaim_at=update(PARKED).where(_c.task_id.in_(ids)).values(claimed_until=None, wake_at=wake),
        done_one=delete(PARKED).where(one),
        unclaim_one=update(PARKED).where(one).values(claimed_until=None),
        unclaim_at_one=update(PARKED).where(one).values(claimed_until=None, wake_at=wake),
        lease_one=select(_c.claimed_until).where(one),
        woken_one=_remember_woken(dialect),
    )


#: Task ids per statement in ``done``/``unclaim`` on the SQLAlchemy path (under every driver's limit).
CHUNK = 500


def chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    """*ids* in slices of at most :data:`CHUNK`, one statement's ``IN (...)`` each."""
    return (ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK))


def inserted(conn: Connection, sql: Statements, values: dict[str, Any]) -> bool:
    """Run the park INSERT of one row on *conn*: True if the row went in."""
    if sql.park_returns:
        # A row comes back only if the insert happened (not on ON CONFLICT DO NOTHING).
        # (rowcount is no use here: psycopg reports -1 for an INSERT ... RETURNING.)
        return conn.execute(sql.park, values).first() is not None
    return bool(conn.execute(sql.park, values).rowcount == 1)
