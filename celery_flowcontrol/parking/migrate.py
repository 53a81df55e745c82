"""Create and upgrade the parking tables with the Alembic migrations shipped in the package.

The migrations live in the repository's top-level ``migrations/`` directory, installed as
``celery_flowcontrol._migrations``. :func:`migrate` runs them programmatically (what
``celery -A proj flowcontrol migrate`` calls); ``alembic -c alembic.ini upgrade head -x url=...``
runs the same ones from a checkout.

Alembic's bookkeeping table is ``flowcontrol_alembic_version``, so the parking tables can share
a database, and even a schema, with an application's own Alembic history.

Every upgrade runs in one transaction: on PostgreSQL under an advisory lock, on SQLite under
``BEGIN IMMEDIATE``. Two workers starting together therefore migrate one after the other, and
the second finds nothing left to do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from ..errors import FlowControlError, ParkingUnavailableError
from .engine import create_parking_engine

__all__ = [
    "VERSION_TABLE",
    "current_revisions",
    "include_object",
    "migrate",
    "migration_connection",
    "script_location",
    "upgrade_engine",
]

VERSION_TABLE = "flowcontrol_alembic_version"
#: Alembic logs a line per plugin it sets up at INFO: seven lines on a worker's first start
#: with the auto-created SQLite default, before the "Running upgrade" lines that matter.
PLUGIN_LOGGER = "alembic.runtime.plugins"
MIGRATIONS_PACKAGE = "celery_flowcontrol._migrations"
#: pg_advisory_xact_lock key serialising concurrent upgrades (an arbitrary constant: "fcmi").
LOCK_KEY = 0x66636D69


def script_location() -> str:
    """The directory holding ``env.py`` and ``versions/``: the installed package, else the repo's."""
    try:
        from importlib.resources import files

        installed = files(MIGRATIONS_PACKAGE)
        if installed.joinpath("env.py").is_file():
            return str(installed)
    except ModuleNotFoundError:
        pass
    # A checkout used without installing it (PYTHONPATH=...): the migrations sit beside the package.
    repo = Path(__file__).resolve().parents[2] / "migrations"
    if (repo / "env.py").is_file():
        return str(repo)
    raise FlowControlError(f"the parking migrations are missing: neither {MIGRATIONS_PACKAGE} nor {repo} exists")


@contextmanager
def migration_connection(target: str | URL | Engine) -> Iterator[Connection]:
    """A connection inside one transaction that holds the migration lock; commits on exit."""
    engine = target if isinstance(target, Engine) else create_parking_engine(target, autocommit=False)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                # The store's own engines autocommit; DDL and its bookkeeping must commit together.
                conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():  # SQLite: BEGIN IMMEDIATE, taking the database's write lock.
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
                yield conn
    finally:
        if engine is not target:
            engine.dispose()


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision``; errors are SQLAlchemy's own."""
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", script_location())
    with migration_connection(engine) as conn:
        # Already there: say nothing. (Alembic itself would log its set-up at INFO, on every
        # worker start with the auto-created SQLite default.)
        wanted = set(ScriptDirectory.from_config(config).get_revisions(revision))
        if wanted and {script.revision for script in wanted} == current_revisions(conn):
            return
        # env.py uses this connection, and so this transaction, instead of opening its own.
        config.attributes["connection"] = conn
        with _quiet(PLUGIN_LOGGER):
            command.upgrade(config, revision)


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger *name* at WARNING at the least while the block runs."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        log.setLevel(level)


def include_object(dialect: str) -> Callable[..., bool]:
    """An autogenerate ``include_object`` for ``dialect``: leaves out the model's objects that are
    created on other dialects only (``ddl_if``), which a database of this one rightly lacks."""

    named = SimpleNamespace(name=dialect)  # all the model's ddl_if() callables look at

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        only = getattr(obj, "_ddl_if", None)  # SQLAlchemy keeps ddl_if() here
        if reflected or only is None:
            return True
        if only.dialect not in (None, dialect):
            return False
        return only.callable_ is None or bool(only.callable_(None, obj, None, state=only.state, dialect=named))

    return include


def current_revisions(conn: Connection) -> set[str]:
    """The revisions the database says it is at (empty before the first migration)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return set()
    return {str(rev) for rev in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()}


def migrate(url: str | URL, revision: str = "head") -> None:
    """Create or upgrade the parking tables at ``url`` to ``revision`` (idempotent).

    Raises :class:`ParkingUnavailableError` when the database can't be reached.
    """
    engine = create_parking_engine(url, autocommit=False)
    try:
        upgrade_engine(engine, revision)
    except SQLAlchemyError as exc:
        where = engine.url.render_as_string(hide_password=True)
        raise ParkingUnavailableError(f"can't migrate the parking database {where}: {exc}") from exc
    finally:
        engine.dispose()
