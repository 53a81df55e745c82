"""The ``PARKED`` state: a parked task says so in the result backend (``flowcontrol_track_parked``).

Like Celery's ``task_track_started``, off by default. Once a park commits (a worker's, alone
or a batch of them: worker/parkbatch.py; or a producer's, a debounced call or a ``flow_batch``
call: :func:`parked_by_producer`), the tasks whose rows it stored get the state ``PARKED`` with the meta
``{"queue", "reason", "retry_at", "parked_at"}``, so ``AsyncResult.state``, Flower and any
reader of the result backend see them. Never before the commit: a state must not promise a
row that is not there. The task then moves on through Celery's own states (STARTED with
``task_track_started``, its ending); a task that ends while parked (expired, revoked,
refused) is ended by Celery or by the worker as any task is, which overwrites ``PARKED``.

A batch of parks is one write to the result backend where it allows (compat.py's
``store_states``: one pipeline on Redis, one transaction on the database backend), else one
per task. A debounced call's ``retry_at`` is its burst's due instant, written again as each
later call of the burst defers it; a ``flow_batch`` call's is its batch's. ``ignore_result`` tasks, and
tasks this worker does not know, are left alone. A result backend that fails is logged and
never undoes a park (the row is committed, the message acked).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from celery.backends.base import DisabledBackend

from .compat import store_states
from .parking import ParkedMessage
from .reasons import reason_of

__all__ = ["PARKED", "ParkedStates", "parked_by_producer", "parked_meta"]

logger = logging.getLogger(__name__)

#: The custom state of a parked task in the result backend.
PARKED = "PARKED"


def parked_meta(row: ParkedMessage, now: float) -> dict[str, Any]:
    """The meta of *row*'s ``PARKED`` state (committed at *now*, if the row does not say)."""
    reason = reason_of(row.reason)
    return {"queue": row.queue, "reason": reason.value if reason else row.reason,
            "retry_at": row.wake_at,
            "parked_at": row.parked_at if row.parked_at is not None else now}


class ParkedStates:
    """Writes ``PARKED`` for the rows a park committed, when the app tracks it."""

    def __init__(self, app: Any, *, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled
        self.written = 0

    def committed(self, rows: Iterable[ParkedMessage], now: float) -> None:
        """*rows* are committed at *now* (and their messages acked): set their state, in one
        write where the result backend allows."""
        if not self.enabled:
            return
        metas = {r.task_id: parked_meta(r, now) for r in rows if self._tracked(r)}
        if not metas:
            return
        try:
            store_states(self.app.backend, PARKED, metas)
        except Exception as exc:  # the row is parked whatever the result backend says
            logger.warning("flowcontrol: the PARKED state of %d task(s) was not stored: %r",
                           len(metas), exc)
            return
        self.written += len(metas)

    def _tracked(self, row: ParkedMessage) -> bool:
        task = self.app.tasks.get(row.task_name)
        if task is None or task.ignore_result or row.headers.get("ignore_result"):
            return False
        return not isinstance(self.app.backend, DisabledBackend)


def parked_by_producer(app: Any, rows: Iterable[ParkedMessage]) -> None:
    """*rows* a producer parked itself (a debounced call, a ``flow_batch`` call) are
    committed: ``PARKED`` as a worker's park sets it, when *app* tracks it."""
    from .engines import engines_of

    if engines_of(app).settings.track_parked:
        ParkedStates(app, enabled=True).committed(rows, time.time())
