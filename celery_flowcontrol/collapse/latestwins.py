"""``flow_unique_keep="latest"``: the newest call of a unique key wins (docs/collapse.md).

Publish (:func:`latest_call`): the call is sent, then made the newest of its key
(latest.py's ``claim``, atomic); the call it replaces ends REVOKED at once, its result a
``TaskRevokedError("replaced by <id>", {"replaced_by": <id>, "task": <name>})``, and if that
call runs now, it is terminated (:func:`flowcontrol_stop_replaced`, a remote control
command: prefork stops it; other pools can't, and its result is discarded when it ends).
The call carries :data:`UNIQUE_KEY_HEADER` and :data:`UNIQUE_KEEP_HEADER` = ``"latest"``.

Run: collapse/latestrun.py, in the process that runs the call.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from celery import states
from celery.exceptions import TaskRevokedError
from celery.worker import state as worker_state
from celery.worker.control import control_command

from ..protocol import UNIQUE_KEEP_HEADER, UNIQUE_KEY_HEADER
from .latest import LATEST
from .wiring import latest_of

__all__ = ["STOP_COMMAND", "flowcontrol_stop_replaced", "latest_call", "latest_key_of",
           "mark_replaced", "revoke_run"]

logger = logging.getLogger(__name__)

#: The remote control command that stops a replaced run (:func:`flowcontrol_stop_replaced`).
STOP_COMMAND = "flowcontrol_stop_replaced"


def latest_call(app: Any, name: str, ukey: str, task_id: str, ttl: float,
                options: dict[str, Any], send: Callable[[str, dict[str, Any]], Any]) -> Any:
    """Send *task_id*, the newest call of latest-wins key *ukey*, and replace the call it
    supersedes (module docstring); what *send* returns."""
    headers = options["headers"]
    headers[UNIQUE_KEY_HEADER] = ukey
    headers[UNIQUE_KEEP_HEADER] = LATEST
    keys = latest_of(app)
    # Newest before it is sent: a worker that starts it at once must find it the newest.
    previous, runner = keys.claim(ukey, task_id, ttl)
    try:
        sent = send(task_id, options)
    except BaseException:
        if previous is not None:  # never sent: the call it would have replaced goes on
            keys.claim(ukey, previous, ttl, only_if=task_id)
        else:
            keys.finish(ukey, task_id)
        raise
    if previous is not None:
        mark_replaced(app, previous, task_id, name)
        if runner == previous:
            revoke_run(app, previous)
    return sent


def revoke_run(app: Any, task_id: str) -> None:
    """Stop the run of *task_id*, where the pool can (prefork: terminated, as Celery's
    ``revoke(terminate=True)`` does), through :func:`flowcontrol_stop_replaced` on every
    worker. Not Celery's own ``revoke``: each worker that gets it stores ``REVOKED
    ("revoked")`` at once, over the result naming the successor, whenever it comes."""
    try:
        app.control.broadcast(STOP_COMMAND, arguments={"task_id": task_id})
    except Exception as exc:  # the broker is down: its successor asks again (NUDGE)
        logger.warning("flowcontrol: can't stop replaced run %s: %s", task_id, exc)


@control_command(args=[("task_id", str)], signature="<task_id>")
def flowcontrol_stop_replaced(state: Any, task_id: str = "", **kwargs: Any) -> dict[str, str]:
    """Terminate the run of *task_id* if it runs here (a newer call of its latest-wins key
    replaced it): prefork stops its process, and Celery then ends it REVOKED and sends
    ``task_revoked``, on which landing.py frees its lease and names its successor. A pool
    that can't terminate lets it run to its end, which discards its result. Registered in
    the worker's main process, which imports this module (landing.py)."""
    request = worker_state.requests.get(str(task_id))
    if request is None:
        return {"ok": "not running here"}
    try:
        request.terminate(state.consumer.pool, signal=signal.SIGTERM)
    except NotImplementedError:
        return {"ok": "this pool can't terminate: its result is discarded when it ends"}
    return {"ok": "terminated"}


def mark_replaced(app: Any, task_id: str, successor: str, name: str) -> None:
    """End *task_id* REVOKED, its result naming the call that replaced it."""
    backend = app.backend
    if type(backend).__name__ == "DisabledBackend":
        return
    exc = TaskRevokedError(f"replaced by {successor}", {"replaced_by": successor, "task": name})
    try:
        backend.store_result(task_id, exc, states.REVOKED)
    except NotImplementedError:
        pass  # a backend that keeps no results: nothing to say
    except Exception as error:
        logger.warning("flowcontrol: can't mark %s replaced: %s", task_id, error)


def latest_key_of(request: Any) -> str | None:
    """The latest-wins key a call's request carries, ``None``: not a latest-wins call."""
    if request is None:
        return None
    headers = getattr(request, "headers", None) or {}  # where a request keeps what it did not map

    def read(name: str) -> Any:
        value = getattr(request, name, None)
        return headers.get(name) if value is None and isinstance(headers, dict) else value

    key = read(UNIQUE_KEY_HEADER)
    return key if read(UNIQUE_KEEP_HEADER) == LATEST and isinstance(key, str) and key else None
