"""A task that raised ``FlowBackoff``: pause its queue (or key), give its slot back, and park it
until the backoff ends.

``FlowBackoff`` is a Celery ``Ignore``: the pool process stores no result and retries nothing,
and the worker's main process hears of it in ``FlowRequest.on_failure`` (request.py), where
:func:`park_after_backoff` runs before Celery acks the message:

1. the backoff goes to the admission backend (fleet-wide on a shared one): nothing of the
   queue (``scope="queue"``) or of the task's fairness key (``scope="key"``) is admitted
   until it ends, and a queue backoff halves the queue's adaptive limits;
2. the task's slot is released now (a manual slot stays: it outlives runs by design);
3. the message itself is parked until the backoff's end, as a denied message is (committed
   before the ack), so it runs again when due with its task id and its ``retries`` as they
   were: not a retry and not a failure.

When the parking database can't take it, the message is given back to the broker instead of
acked (the backoff in the backend holds it back there); nothing is lost.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.state import task_ready

from ..errors import FlowControlError
from ..protocol import read_options
from ..reasons import Reason
from ..task import FlowBackoff
from .runtime_registry import runtime_of

logger = logging.getLogger(__name__)

#: The reason a parked row of a backed-off task carries (``celery flowcontrol parked``).
BACKOFF_REASON = Reason.BACKOFF.value


def backoff_of(exc_info: Any) -> FlowBackoff | None:
    """The ``FlowBackoff`` a request's failure is, or ``None``."""
    exc = getattr(exc_info, "exception", None)
    exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback
    return exc if isinstance(exc, FlowBackoff) else None


def park_after_backoff(request: Any, exc: FlowBackoff, release: Any) -> bool:
    """Handle *request*'s ``FlowBackoff`` (module docstring); *release* frees its slots
    (request.py's own release). True if the message is parked and may be acked, False if
    it was given back to the broker (the caller must not ack it)."""
    runtime = runtime_of(request.app)
    message = request.message
    opts = read_options(message.headers or {}, request.task)
    if runtime is None or opts is None:
        logger.warning("flowcontrol: task %s[%s] raised FlowBackoff outside a flow queue: "
                       "dropped like Celery's Ignore", request.name, request.id)
        release()
        return True
    parker = runtime.parker
    key = opts.key if exc.scope == "key" else None
    until = parker.clock() + exc.retry_after
    try:
        until = runtime.engines.backend.backoff(opts.queue, exc.retry_after, key)
    except FlowControlError as exc_:  # an outage: the task still waits its backoff
        logger.warning("flowcontrol: backoff of %s not recorded (%s); task %s parks anyway",
                       opts.queue, exc_, request.id)
    release()
    try:
        parked = parker.park(message, task_name=str(request.task.name), queue=opts.queue,
                                  priority=opts.priority, key=opts.key, wake_at=until,
                                  reason=BACKOFF_REASON, ack=lambda: None)
    except FlowControlError as exc_:
        parked = False
        logger.warning("flowcontrol: task %s can't be parked after its backoff (%s): given "
                       "back to the broker", request.id, exc_)
    if not parked:
        task_ready(request)  # what Celery's on_failure would have done first
        request.reject(requeue=True)
    return parked


__all__ = ["BACKOFF_REASON", "backoff_of", "park_after_backoff"]
