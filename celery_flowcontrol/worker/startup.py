"""What a worker makes sure of at boot, before its flow control takes any message.

* **The parking URL** loads a SQLAlchemy dialect: a wrong one (``postgres://``) or a malformed
  URL is a :class:`~celery_flowcontrol.errors.FlowControlConfigError` naming
  ``flowcontrol_parking_url``, which stops the worker: no retry can fix it.
* **The parking tables** exist. SQLite (the default) creates its own, migrated under
  ``BEGIN IMMEDIATE``: the file is this machine's. Any other database is shared and its DDL is
  the operator's: missing tables are reported once, with the command that creates them
  (``celery -A proj flowcontrol migrate``), and the worker waits for them before it takes a
  message, so it holds none that it could not park. A database that can't be reached is left to
  the outage handling of the running worker (messages stay in the broker and are retried).
* **The admission backend** answers: one that does not (Redis down during a fleet restart) is
  tried again with a growing delay, as Celery retries its broker at startup, one log line per
  retry, at most ``flowcontrol_backend_connection_max_retries`` times (``0``: for ever, as
  Celery's ``broker_connection_max_retries``);
  then :class:`~celery_flowcontrol.errors.BackendUnavailableError` stops the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..engines import Engines
from ..errors import BackendUnavailableError, ParkingUnavailableError

logger = logging.getLogger(__name__)

#: Seconds before retry n (1-based) of an unreachable backend: 2, 4, 6 ... at most 30, as
#: Celery's broker connection at startup.
RETRY_STEP = 2.0
RETRY_MAX = 30.0
#: Seconds between two looks for the parking tables while they are missing.
TABLES_EVERY = 5.0


def retry_delay(attempt: int) -> float:
    """The delay before retry *attempt* (1-based)."""
    return min(RETRY_STEP * attempt, RETRY_MAX)


def connect_backend(engines: Engines, sleep: Callable[[float], Any] = time.sleep) -> None:
    """Return once the admission backend answers; retry with backoff up to the setting's bound.

    :raises BackendUnavailableError: still unreachable after the last retry.
    """
    limit = engines.settings.backend_connection_max_retries or None  # 0: for ever
    attempt = 0
    while True:
        try:
            engines.backend.queues()  # a read every backend serves: it answers, or it raises
            if attempt:
                logger.warning("flowcontrol: admission backend %s answers again", where(engines))
            return
        except BackendUnavailableError as exc:
            attempt += 1
            if limit is not None and attempt > limit:
                raise BackendUnavailableError(
                    f"admission backend {where(engines)} unreachable at startup after {limit} "
                    f"retries (flowcontrol_backend_connection_max_retries): {exc}") from exc
            delay = retry_delay(attempt)
            logger.error("flowcontrol: admission backend %s unreachable at startup (%s); trying "
                         "again in %.2f seconds... (%d/%s)", where(engines), exc, delay, attempt,
                         "inf" if limit is None else limit)
            sleep(delay)


def wait_for_tables(engines: Engines, sleep: Callable[[float], Any] = time.sleep,
                    every: float = TABLES_EVERY) -> None:
    """Return once the parking tables exist (SQLite creates its own); say once what is missing."""
    store = engines.store  # a bad URL raises FlowControlConfigError here
    said = False
    while True:
        try:
            missing = store.missing_tables()
        except ParkingUnavailableError as exc:
            logger.warning("flowcontrol: can't check the parking tables (%s); the worker starts, "
                           "and defers what it would park until the database answers", exc)
            return
        if not missing:
            if said:
                logger.warning("flowcontrol: the parking tables exist now; flow control starts")
            return
        if not said:
            logger.error(
                "flowcontrol: the parking tables (%s) are missing in %s: create them with "
                "`celery -A %s flowcontrol migrate`. This worker takes no message until they "
                "exist, and looks again every %g s", ", ".join(missing), store_where(engines),
                app_name(engines.app), every)
            said = True
        sleep(every)


def check_at_boot(engines: Engines) -> None:
    """The checks of the module docstring, parking first (a wrong URL fails before any wait)."""
    wait_for_tables(engines)
    connect_backend(engines)


def where(engines: Engines) -> str:
    """The backend's URL as logs may show it (no password), or its class for a ready backend."""
    s = engines.settings
    if s.backend is not None:
        return type(engines.backend).__name__ if "backend" in vars(engines) else "(flowcontrol_backend)"
    url = s.backend_url
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def store_where(engines: Engines) -> str:
    """The parking database's URL, password hidden."""
    return engines.store.url.render_as_string(hide_password=True)


def app_name(app: Any) -> str:
    """What goes after ``celery -A``: the app's main module name, ``proj`` if it has none."""
    main = getattr(app, "main", None)
    return main if isinstance(main, str) and main and main != "__main__" else "proj"
