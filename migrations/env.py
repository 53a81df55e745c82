"""Alembic environment of the parking tables.

Where the database URL comes from, first match wins:

1. ``config.attributes["connection"]``: a connection already inside a transaction
   (:func:`celery_flowcontrol.parking.migrate` passes one); it is used as is.
2. ``config.attributes["url"]``, set by code that builds its own Alembic ``Config``.
3. ``-x url=...`` on the ``alembic`` command line.
4. The ``FLOWCONTROL_PARKING_URL`` environment variable.
5. ``sqlalchemy.url`` in alembic.ini.

Alembic's version table is ``flowcontrol_alembic_version``, apart from any application's own.
SQLite gets ``render_as_batch`` so later ALTERs work there too.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from celery_flowcontrol.parking.migrate import VERSION_TABLE, include_object, migration_connection
from celery_flowcontrol.parking.model import Base

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None and config.file_config.has_section("loggers"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The URL to migrate (see the module docstring), or exit saying how to give one."""
    url = (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("FLOWCONTROL_PARKING_URL")
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise SystemExit("no parking database URL: pass -x url=..., or set FLOWCONTROL_PARKING_URL")
    return str(url)


def run_on(connection: Connection) -> None:
    """Run the migrations on a connection that is already in its transaction."""
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        include_object=include_object(connection.dialect.name),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade head --sql``)."""
    url = database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Migrate a live database, in one locked transaction."""
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    with migration_connection(database_url()) as conn:
        run_on(conn)


if context.is_offline_mode():
    run_offline()
else:
    run_online()
