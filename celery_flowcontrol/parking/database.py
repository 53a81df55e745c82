"""The connections behind one parking URL: engines made on first use, and outages mapped.

Two engines per database where the dialect allows it (engine.py): the durable one for writes a
caller acks after, and a relaxed one whose commits don't wait for the disk. Each gets a fast path
for the hot statements (fastpath.py) on SQLite and PostgreSQL. PostgreSQL has a third pool, relaxed
too, for the due claim alone: its prepared statements are planned on every run (fastpath.py). Like
the others it connects on first use, so only a process that claims due rows opens it.

Every call goes through :meth:`Database.retrying`: a connection the pool finds dead (a server
restart) is replaced once, silently; any other failure to reach or use the database becomes
:class:`~celery_flowcontrol.errors.ParkingUnavailableError`. ``IntegrityError`` and ``DataError``
pass through: they are about a value, not the database, and the store reports them as such.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import DataError, DBAPIError, DisconnectionError, IntegrityError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from ..errors import ParkingUnavailableError
from .engine import READ_ONLY, create_parking_engine, is_memory_sqlite
from .fastpath import FastPath
from .statements import Statements, statements

__all__ = ["OUTAGES", "Database"]

T = TypeVar("T")
#: What the database (or the way to it) raises when it can't serve us. Other SQLAlchemy errors
#: (CompileError, ArgumentError) are bugs, and propagate as they are.
OUTAGES = (DBAPIError, DisconnectionError, PoolTimeoutError)


class Database:
    """The engines of one parking database, created on first use. Thread-safe."""

    def __init__(self, url: URL, *, create: bool, timeout: float) -> None:
        self.url = url
        self.dialect = url.get_backend_name()
        self.create = create
        self.timeout = timeout
        # Switches for the tests (and a debugging session): the portable SQLAlchemy path, and
        # the select-then-update claim of databases without UPDATE ... RETURNING.
        self.use_fast_path = self.dialect == "postgresql" or (
            self.dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 35)
        )
        self.use_returning = True
        self.skip_locked = self.dialect in ("postgresql", "mysql", "mariadb", "oracle")
        self._lock = threading.Lock()
        self._engines: tuple[Engine, Engine] | None = None
        #: PostgreSQL: the due claim's pool (custom plans), made with the others.
        self.planned: Engine | None = None
        self._fast: tuple[FastPath, FastPath] | None = None
        self._created = False
        _DATABASES.add(self)

    def engines(self) -> tuple[Engine, Engine]:
        """(durable, relaxed) engines, made (and on first use migrated, if ``create``) now."""
        with self._lock:
            if self._engines is None:
                wait = self.timeout
                durable = create_parking_engine(self.url, busy_timeout=wait, connect_timeout=wait)
                # A separate pool whose commits don't wait for the disk, where SQLite and
                # PostgreSQL allow that per connection; a memory database has one connection.
                relaxed = durable
                if self.dialect in ("sqlite", "postgresql") and not is_memory_sqlite(self.url):
                    relaxed = create_parking_engine(self.url, relaxed=True, busy_timeout=wait, connect_timeout=wait)
                self._engines = (durable, relaxed)
                if self.use_fast_path:
                    sql = statements(self.dialect, returning=True, insert_returning=True, skip_locked=self.skip_locked)
                    if self.dialect == "postgresql":
                        self.planned = create_parking_engine(
                            self.url, relaxed=True, custom_plans=True, busy_timeout=wait, connect_timeout=wait
                        )
                    self._fast = (FastPath(durable, sql), FastPath(relaxed, sql, planned=self.planned))
            if self.create and not self._created:
                from .migrate import upgrade_engine

                try:
                    upgrade_engine(self._engines[0])
                except OUTAGES as exc:
                    raise self.outage(exc) from exc
                self._created = True
            return self._engines

    def fast(self, relaxed: bool) -> FastPath | None:
        """The driver-level hot path of the durable or relaxed engine, if this database has one."""
        self.engines()
        if not (self.use_fast_path and self.use_returning) or self._fast is None:
            return None
        return self._fast[1 if relaxed else 0]

    def sql(self, conn: Connection) -> Statements:
        """The prebuilt statements for ``conn``'s dialect and what it supports."""
        dialect = conn.dialect
        return statements(
            dialect.name,
            returning=self.use_returning and dialect.update_returning,
            insert_returning=dialect.insert_returning,
            skip_locked=self.skip_locked,
        )

    def run(
        self, op: Callable[[Connection], T], *, relaxed: bool = False, read_only: bool = False, atomic: bool = False
    ) -> T:
        """``op(conn)`` inside one SQLAlchemy transaction (see :meth:`retrying`).

        ``read_only``: a plain BEGIN on SQLite. ``atomic``: ``op`` runs several statements that
        must commit together (the PostgreSQL pools otherwise autocommit each one).
        """
        durable, lax = self.engines()
        engine = lax if relaxed else durable

        def call() -> T:
            with engine.connect() as conn:
                if read_only:
                    conn.execution_options(**{READ_ONLY: True})
                elif atomic and self.dialect == "postgresql":
                    conn.execution_options(isolation_level="READ COMMITTED")
                with conn.begin():
                    return op(conn)

        return self.retrying(call)

    def retrying(self, call: Callable[[], T]) -> T:
        """``call()``, once more on a fresh connection if the pool found its connection dead."""
        for attempt in (1, 2):
            try:
                return call()
            except (IntegrityError, DataError):
                raise
            except DBAPIError as exc:
                # A server restart kills every pooled connection; the first failure invalidates
                # the pool, so one retry gets a fresh connection. Safe: a park is idempotent,
                # and a claim lost this way only waits out its lease.
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise self.outage(exc) from exc
            except OUTAGES as exc:  # a pool timeout, a connection refused before any DBAPI call
                raise self.outage(exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def outage(self, exc: SQLAlchemyError) -> ParkingUnavailableError:
        """The error a caller sees for ``exc``: the database (hidden password) and the cause."""
        cause = getattr(exc, "orig", None) or exc
        where = self.url.render_as_string(hide_password=True)
        return ParkingUnavailableError(f"parking database {where} is unavailable: {type(cause).__name__}: {cause}")

    def close(self) -> None:
        """Close the pooled connections; the next call reconnects."""
        with self._lock:
            engines, self._engines, self._fast = self._all_engines(), None, None
            self.planned = None
        for engine in engines:
            engine.dispose()

    def _all_engines(self) -> set[Engine]:
        return set(self._engines or ()) | ({self.planned} if self.planned is not None else set())

    def _forget_after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at fork time
        for engine in self._all_engines():
            engine.dispose(close=False)


# A forked child (Celery's prefork pool) must not reuse the parent's sockets: drop them there
# without closing, so the parent's connections stay intact.
_DATABASES: weakref.WeakSet[Database] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for database in list(_DATABASES):
        database._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
