"""The hot path (park, claim, done, unclaim) on SQLite and PostgreSQL, straight on the driver.

Why: a SQLAlchemy ``Connection`` transaction costs about as much Python (pool checkout, begin,
execution context, result wrapping) as the statement itself on SQLite, and a parked task's life
is three transactions (park, claim, done).

How: the statements of statements.py are compiled once per engine, and run on the pool's own
DBAPI connection (``engine.raw_connection()``: same pool, same connect-time settings). The values
are the drivers' native types (str, int, float, bytes, None), so SQLAlchemy's type processing has
nothing to do. Driver errors are wrapped exactly as SQLAlchemy wraps them (``DBAPIError``, with
``connection_invalidated`` when the connection died), so the store maps both paths alike.

PostgreSQL: every operation is one statement and one round trip in autocommit (no BEGIN/COMMIT).
The due claim's best index depends on ``now`` (model.py), so it runs on a pool of its own
(database.py) whose connections force a custom plan: prepared once per connection, planned for
each run's ``now``; and it picks with ``seq = ANY(ARRAY(SELECT ... FOR UPDATE SKIP LOCKED))``
(statements.py), an InitPlan with no semi-join to plan. What each of these saved, measured, is
in docs/parking.md; the rates against a raw insert are benchmarks/parking.py's (REPORT.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .engine import CUSTOM_PLANS
from .statements import PARKED, Statements

__all__ = ["COLUMNS", "FastPath"]

#: Column names, in the order RETURNING gives them.
COLUMNS = tuple(PARKED.c.keys())
#: Sample values: compiling with them fixes each statement's parameters (and the INSERT's columns).
_PARK_KEYS = [key for key in COLUMNS if key != "seq"]
_SAMPLES: dict[str, Any] = {"now": 0.0, "until": 0.0, "limit": 1, "tid": "", "wake": 0.0}


class _Compiled:
    """One statement as SQL text, plus the values of the parameters SQLAlchemy bound itself."""

    def __init__(self, engine: Engine, statement: Any, keys: Sequence[str]) -> None:
        compiled = statement.compile(dialect=engine.dialect, column_keys=list(keys))
        self.sql = compiled.string
        sample = dict.fromkeys(keys) | {k: v for k, v in _SAMPLES.items() if k in compiled.binds}
        # e.g. ``attempts + 1`` or SQLite's ``OFFSET 0``: bound by SQLAlchemy, constant.
        self.fixed = {k: v for k, v in compiled.construct_params(sample).items() if k not in sample}
        #: The engine to run on instead of the fast path's own (PostgreSQL's due claim).
        self.engine: Engine | None = None


class FastPath:
    """The store's hot-path statements for one engine (SQLite with the named paramstyle, or
    PostgreSQL in autocommit)."""

    def __init__(self, engine: Engine, sql: Statements, *, planned: Engine | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.sqlite = engine.dialect.name == "sqlite"
        self.park = _Compiled(engine, sql.park, _PARK_KEYS)
        self.claim_due = _Compiled(engine, sql.claim_due, ["now", "until", "limit"])
        self.claim_one = _Compiled(engine, sql.claim_one, ["now", "until", "limit", "tid"])
        if engine.dialect.name == "postgresql":
            # Its plan must fit each run's ``now`` (see the module docstring): on ``planned``
            # (custom plans only), prepared; on an ordinary connection, sent unprepared.
            self.claim_due.engine = planned or engine
        self.done_one = _Compiled(engine, sql.done_one, ["tid"])
        self.unclaim_one = _Compiled(engine, sql.unclaim_one, ["tid"])
        self.unclaim_at_one = _Compiled(engine, sql.unclaim_at_one, ["tid", "wake"])
        self.lease_one = _Compiled(engine, sql.lease_one, ["tid"])
        self.woken_one = _Compiled(engine, sql.woken_one, ["task_id", "ticket", "seq", "attempts", "woken_at"])

    def rows(self, statement: _Compiled, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run a claim: the rows of ``flowcontrol_parked`` it returns, as column -> value."""
        return [dict(zip(COLUMNS, row, strict=True)) for row in self._run(statement, [params], fetch=True)]

    def rows_many(self, statement: _Compiled, many: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run a claim once per parameter set, in one transaction; every row they return."""
        return [dict(zip(COLUMNS, row, strict=True)) for row in self._run(statement, many, fetch=True)]

    def parked(self, values: dict[str, Any]) -> bool:
        """Run the park INSERT: True if the row went in, False if its task id was there."""
        return bool(self._run(self.park, [values], fetch=True))

    def parked_many(self, many: list[dict[str, Any]]) -> list[bool]:
        """Run the park INSERT once per row, in order, in one transaction (one commit for
        all, or none of them on an error): for each, True if it went in."""
        return [bool(rows) for rows in self._run(self.park, many, fetch=True, atomic=True)]

    def count(self, statement: _Compiled, many: list[dict[str, Any]]) -> int:
        """Run a statement once per parameter set, in one transaction; rows changed in all."""
        return int(self._run(statement, many, fetch=False))

    def read(self, statement: _Compiled, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run a read: its rows. No write lock on SQLite (a plain autocommit SELECT)."""
        return list(self._run(statement, [params], fetch=True, write=False))

    def _run(self, statement: _Compiled, many: list[dict[str, Any]], *, fetch: bool,
             write: bool = True, atomic: bool = False) -> Any:
        """Run *statement* once per parameter set. *atomic* (with *fetch*): in one transaction
        on PostgreSQL too, and the rows of each run apart, one list per parameter set."""
        params = [statement.fixed | p for p in many]
        error = self.dialect.loaded_dbapi.Error
        try:
            raw = (statement.engine or self.engine).raw_connection()
        except error as exc:  # the server is down or refuses us: nothing to invalidate
            raise DBAPIError.instance(None, None, exc, error, dialect=self.dialect) from exc
        cursor = None
        try:
            dbapi: Any = raw.driver_connection
            if self.sqlite and write:
                dbapi.execute("BEGIN IMMEDIATE")  # one writer at a time (see engine.py)
            elif not self.sqlite and not dbapi.autocommit:
                # A pooled connection an atomic (READ COMMITTED) transaction used last, given
                # back without its autocommit on SQLAlchemy 2.0.0's psycopg dialect: a write
                # here would open a transaction nobody commits (the row never visible, then
                # rolled back). Nothing of ours is pending on it (the pool rolled back).
                dbapi.rollback()
                dbapi.autocommit = True
            cursor = raw.cursor()
            result: Any
            options: dict[str, Any] = {}
            if statement.engine is not None:  # planned per run: prepared only if the server obliges
                options["prepare"] = bool(raw.info.get(CUSTOM_PLANS, False))
            if atomic:
                if not self.sqlite:
                    cursor.execute("BEGIN")  # the connection autocommits: one transaction here
                result = []
                for p in params:
                    cursor.execute(statement.sql, p, **options)
                    result.append(cursor.fetchall())
                if not self.sqlite:
                    cursor.execute("COMMIT")
            elif len(params) == 1:
                cursor.execute(statement.sql, params[0], **options)
                result = cursor.fetchall() if fetch else cursor.rowcount
            elif fetch:
                # executemany can't return rows: one execute each, still one transaction
                # (SQLite; PostgreSQL autocommits each, which a claim allows).
                result = []
                for p in params:
                    cursor.execute(statement.sql, p, **options)
                    result.extend(cursor.fetchall())
            else:
                cursor.executemany(statement.sql, params)
                result = cursor.rowcount
            if self.sqlite and write:
                dbapi.commit()
            # PostgreSQL: the connection autocommits, one statement per transaction.
            return result
        except error as exc:
            gone = self.dialect.is_disconnect(exc, raw.dbapi_connection, cursor)
            if gone:
                raw.invalidate(exc)
            else:
                _rollback(raw)
            raise DBAPIError.instance(
                statement.sql, many[0], exc, error, connection_invalidated=gone, dialect=self.dialect
            ) from exc
        except BaseException:
            _rollback(raw)
            raise
        finally:
            if cursor is not None:
                cursor.close()
            raw.close()  # back to the pool (or discarded, if invalidated)


def _rollback(raw: Any) -> None:
    try:
        raw.rollback()
    except Exception:  # the connection is going back to the pool, which resets or drops it
        pass
