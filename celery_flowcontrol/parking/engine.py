"""Engines for the parking store: URL checks, driver choice, and each dialect's durability settings.

Features
    SQLite: WAL journal, ``busy_timeout``, and ``BEGIN IMMEDIATE`` for every write transaction
    (one writer at a time, so a read-then-write claim never hits ``SQLITE_BUSY`` half-way).
    ``synchronous=FULL`` on the durable engine: a commit that returned survives a power loss.
    PostgreSQL: ``connect_timeout`` (a dead host fails fast instead of hanging a worker) and
    autocommit, because every store operation is one statement and so needs no BEGIN/COMMIT
    round trips of its own.

Connection
    Any SQLAlchemy URL. ``postgresql://`` picks psycopg 3 when it is installed (the
    ``postgres`` extra), else SQLAlchemy's default driver. An in-memory SQLite URL
    (``sqlite://``) shares one connection: for single-threaded tests only.

Options
    ``relaxed=True`` builds the engine for writes whose loss in a crash is harmless (a claim's
    lease, the delete after a wake): SQLite ``synchronous=NORMAL`` (still safe against a process
    crash; the next durable commit syncs it), PostgreSQL ``synchronous_commit=off``.
    ``custom_plans=True`` (PostgreSQL 12+): ``plan_cache_mode=force_custom_plan``, so a
    prepared statement is still planned for each run's parameters (the due claim: fastpath.py).
"""

from __future__ import annotations

import importlib.util
import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from ..errors import FlowControlConfigError, MissingDependencyError

__all__ = ["CUSTOM_PLANS", "create_parking_engine", "is_memory_sqlite", "parking_url"]

SETTING = "flowcontrol_parking_url"
#: Connection option: open the transaction with a plain (deferred) BEGIN on SQLite: a read.
READ_ONLY = "flowcontrol_read_only"
#: Pooled connection info key: True if the server plans this connection's prepared statements
#: for each run's parameters (``custom_plans``), so they may be prepared without a generic plan.
CUSTOM_PLANS = "flowcontrol_custom_plans"


def parking_url(url: str | URL) -> URL:
    """Parse and normalise a parking URL; a bad one is a :class:`FlowControlConfigError`."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise FlowControlConfigError(f"not a SQLAlchemy URL: {url!r} ({exc})", None, SETTING) from exc
    # SQLAlchemy 2.0 maps a bare postgresql:// to psycopg2, which our extra does not install.
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is not None:
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        parsed.get_dialect()  # loads SQLAlchemy's dialect only; no driver, no connection
    except NoSuchModuleError:
        # A dialect name no retry can fix ("postgres://", gone from SQLAlchemy since 1.4).
        hint = "postgresql+psycopg" if parsed.get_backend_name() in ("postgres", "pg", "psql") else None
        raise FlowControlConfigError(
            f"has no SQLAlchemy dialect {parsed.drivername!r}: "
            + (f"did you mean {hint}://...? " if hint else "")
            + f"(got {parsed.render_as_string(hide_password=True)!r}; e.g. "
            "postgresql+psycopg://user@host/db, sqlite:///flowcontrol.sqlite3)", None, SETTING) from None
    return parsed


def is_memory_sqlite(url: URL) -> bool:
    """True for an in-memory SQLite URL (one database per connection unless the pool is static)."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_parking_engine(
    url: str | URL,
    *,
    relaxed: bool = False,
    custom_plans: bool = False,
    autocommit: bool = True,
    busy_timeout: float = 10.0,
    connect_timeout: float = 5.0,
) -> Engine:
    """Build an engine for ``url`` with the settings described in the module docstring.

    ``autocommit=False`` gives PostgreSQL ordinary transactions (for migrations). ``busy_timeout``
    (SQLite) is how long a write waits for another writer before it fails as an outage;
    ``connect_timeout`` (PostgreSQL) how long a connection attempt may take. Raises
    :class:`FlowControlConfigError` for an unknown dialect and :class:`MissingDependencyError`
    when the PostgreSQL driver is missing. Creating an engine opens no connection.
    """
    parsed = parking_url(url)
    backend = parsed.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        # Named parameters (:name): the fast path hands the driver dicts (fastpath.py).
        kwargs["paramstyle"] = "named"
    if backend == "sqlite" and is_memory_sqlite(parsed):
        # One shared connection, or every checkout would see a new, empty database.
        kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
    if backend == "postgresql":
        if "connect_timeout" not in parsed.query:
            kwargs["connect_args"] = {"connect_timeout": max(1, round(connect_timeout))}
        if autocommit:
            kwargs["isolation_level"] = "AUTOCOMMIT"
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError as exc:
        raise FlowControlConfigError(f"unknown database dialect in {parsed!r}", None, SETTING) from exc
    except ImportError as exc:
        if backend == "postgresql":
            raise MissingDependencyError("postgres", exc.name or parsed.get_driver_name()) from exc
        raise FlowControlConfigError(f"the driver for {parsed!r} is not installed: {exc}", None, SETTING) from exc
    if backend == "sqlite":
        _sqlite_events(engine, relaxed=relaxed, busy_ms=int(busy_timeout * 1000), wal=not is_memory_sqlite(parsed))
    elif backend == "postgresql" and (relaxed or custom_plans):
        _postgres_session(engine, relaxed=relaxed, custom_plans=custom_plans)
    return engine


def _use_wal(cursor: Any, wait: float) -> None:
    """Switch the database to WAL (it stays so, in the file). The switch takes the database's
    exclusive lock and, unlike other statements, fails at once when another connection holds
    a lock, without waiting out ``busy_timeout``: several processes opening a new database at
    once (workers starting with the SQLite default) would see "database is locked". So the
    mode is read first (WAL already: nothing to do), and the switch is retried for ``wait``."""
    deadline = time.monotonic() + wait
    while True:
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _sqlite_events(engine: Engine, *, relaxed: bool, busy_ms: int, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (it would BEGIN DEFERRED by
        # itself before DML): the "begin" listener below says how each transaction starts.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if wal:
                _use_wal(cursor, busy_ms / 1000)
            cursor.execute(f"PRAGMA synchronous = {'NORMAL' if relaxed else 'FULL'}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        sql = "BEGIN" if connection.get_execution_options().get(READ_ONLY, False) else "BEGIN IMMEDIATE"
        # Straight to the driver: SQLAlchemy's execute path costs more than BEGIN itself, on
        # every transaction. Its errors are wrapped as SQLAlchemy would have ("database is
        # locked" -> OperationalError), so callers see one kind of error either way.
        try:
            connection.connection.driver_connection.execute(sql)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc


def _postgres_session(engine: Engine, *, relaxed: bool, custom_plans: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, record: Any) -> None:
        # Session-wide, so set once per connection; commit because the driver opened a
        # transaction for it (the pool switches autocommit on only at checkout).
        custom = custom_plans and dbapi_connection.info.server_version >= 120000  # new in 12
        cursor = dbapi_connection.cursor()
        try:
            if relaxed:
                cursor.execute("SET synchronous_commit TO off")
            if custom:
                cursor.execute("SET plan_cache_mode TO force_custom_plan")
        finally:
            cursor.close()
        dbapi_connection.commit()
        record.info[CUSTOM_PLANS] = custom
