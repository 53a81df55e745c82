"""The run of a ``flow_unique_keep="latest"`` call (docs/collapse.md), in the process that
runs the task, before the body: :func:`run_latest`. Publish is latestwins.py's.

The call takes the key's run lease only while it is the newest and no other run holds the
lease; a replaced call ends REVOKED (latestwins.py's ``mark_replaced``) without running; a
call whose predecessor still runs (being terminated, or on a killed node whose lease lapses
within ``flowcontrol_instance_ttl``) waits for it, and asks again for its end after
:data:`NUDGE` seconds (a producer may have died before it asked). The lease is renewed while
the body runs; when it ends, the lease is freed, and if a newer call came meanwhile the result
is discarded (REVOKED as above). So two runs of one key never overlap, fleet-wide with the
Redis backend, per process with ``memory://``. A run terminated on prefork frees its lease in
the worker's main process (landing.py, ``task_revoked``), which also restores the replaced
meta Celery's own ``terminated`` overwrote.

``FlowTask.__call__`` reaches this module by name (``FlowTask.LatestRun``), as Celery reaches
the task's ``Strategy`` and ``Request``: the worker's side of a call, which task.py does not
import.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from celery.exceptions import Ignore, Retry

from ..engines import engines_of, unproxy
from ..protocol import QUEUE_HEADER
from ..task import FlowBackoff
from .keys import option_of, unique_ttl
from .latest import BUSY, REPLACED
from .latestwins import mark_replaced, revoke_run
from .wiring import latest_of

__all__ = ["run_latest", "run_ttl"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at a busy key by a call waiting for its predecessor's end.
POLL = 0.05
#: Seconds a call waits on a predecessor that still runs before it revokes it itself.
NUDGE = 2.0
#: Seconds before a run that could not read its key (an outage) is tried again.
RETRY_AFTER = 1.0


def run_ttl(task: Any) -> float:
    """The unique TTL of a run of *task*: its ``flow_unique_ttl``, else its flow queue's
    ``max_hold``, else one hour (as at publish)."""
    queue = task.request.get(QUEUE_HEADER) or getattr(task, "flow_queue", None)
    config = engines_of(task.app).config_of(queue) if isinstance(queue, str) else None
    return unique_ttl(task.name, option_of(task, "flow_unique_ttl"),
                      getattr(config, "max_hold", None))


def run_latest(task: Any, ukey: str, body: Callable[[], Any]) -> Any:
    """Run *body*, the run of *task*'s current call of latest-wins key *ukey*, as the module
    docstring says; a replaced call raises ``Ignore`` (its REVOKED state is stored)."""
    app = task.app
    task_id = str(task.request.id)
    keys = latest_of(app)
    lease = engines_of(app).settings.instance_ttl
    ttl = run_ttl(task)
    waiting_since = time.monotonic()
    nudged: str | None = None
    while True:
        try:
            verdict, other = keys.start(ukey, task_id, lease, ttl)
        except Exception as exc:
            # The keys can't be read (Redis unreachable): running could overlap another run,
            # and dropping the call would lose it; it runs again in a moment, the same call.
            logger.warning("flowcontrol: latest-wins key of %s unreachable (%s); retrying",
                           task_id, exc)
            raise task.retry(exc=exc, countdown=RETRY_AFTER, max_retries=None) from None
        if verdict == REPLACED:
            mark_replaced(app, task_id, str(other), task.name)
            raise Ignore()
        if verdict != BUSY:
            break
        if other != nudged and time.monotonic() - waiting_since >= NUDGE:
            revoke_run(app, str(other))
            nudged = other
        time.sleep(POLL)
    leases = _leases_of(app, lease)
    leases.hold(ukey, task_id, ttl)
    try:
        value = body()
    except BaseException as exc:
        # A retry or a backoff is the same call going on: it stays the newest.
        going_on = isinstance(exc, (Retry, FlowBackoff))
        _ended(task, ukey, task_id, not going_on, leases)
        raise
    _ended(task, ukey, task_id, True, leases)
    return value


def _ended(task: Any, ukey: str, task_id: str, ending: bool, leases: _Leases) -> None:
    """Free the run's lease; a run a newer call replaced meanwhile is discarded (Ignore)."""
    leases.drop(task_id)
    try:
        successor = latest_of(task.app).finish(ukey, task_id, ending)
    except Exception as exc:  # an outage: the lease lapses by itself; the result stands
        logger.warning("flowcontrol: can't free the latest-wins key of %s: %s", task_id, exc)
        return
    if successor is not None:
        mark_replaced(task.app, task_id, successor, task.name)
        raise Ignore()


class _Leases:
    """The run leases of this process's latest-wins runs, renewed by one thread until they end."""

    def __init__(self, app: Any, lease: float) -> None:
        self.app = app
        self.lease = lease
        self._held: dict[str, tuple[str, float]] = {}  # task id -> (key, renew until)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, ukey: str, task_id: str, ttl: float) -> None:
        with self._lock:
            self._held[task_id] = (ukey, time.monotonic() + ttl)
            if self._thread is None or not self._thread.is_alive():
                # Started here, in the process that runs tasks (after a prefork fork).
                self._thread = threading.Thread(target=self._renew, daemon=True,
                                                name="flowcontrol-latest")
                self._thread.start()

    def drop(self, task_id: str) -> None:
        with self._lock:
            self._held.pop(task_id, None)

    def _renew(self) -> None:
        while True:
            time.sleep(self.lease / 3.0)
            now = time.monotonic()
            with self._lock:
                # A run past its key's TTL stops renewing: a run stuck for good frees its key.
                held = {t: v for t, v in self._held.items() if v[1] > now}
                self._held = dict(held)
            for task_id, (ukey, until) in held.items():
                try:
                    latest_of(self.app).extend(ukey, task_id, min(self.lease, until - now))
                except Exception as exc:  # an outage: the next round tries again
                    logger.warning("flowcontrol: can't renew the latest-wins lease of %s: %s",
                                   task_id, exc)


_LEASES: weakref.WeakKeyDictionary[Any, _Leases] = weakref.WeakKeyDictionary()
_LEASES_LOCK = threading.Lock()


def _leases_of(app: Any, lease: float) -> _Leases:
    app = unproxy(app)
    with _LEASES_LOCK:
        leases = _LEASES.get(app)
        if leases is None:
            leases = _LEASES[app] = _Leases(app, lease)
        return leases
