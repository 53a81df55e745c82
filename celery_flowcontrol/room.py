"""Room to wait: ``apply_async`` refuses a call that a full waiting bound would refuse anyway.

A queue with ``max_waiting``, ``per_key_max_waiting`` or a key's own ``max_waiting``
(docs/tenants.md) refuses a call that would make more than that many wait. The worker always
does (worker/refusal.py: the task ends FAILURE with ``FlowQueueFull``); a producer that can see
the backend says so at once instead, by raising :class:`~celery_flowcontrol.FlowQueueFull`
from ``apply_async``, so the caller (a web request, say) can answer "try later" while nothing
is sent.

One read (``AdmissionBackend.would_refuse``: one round trip, no state change), and only where it
can matter: ``FlowControl(app)`` installed in this process, and the queue's config as this
process knows it sets a waiting bound. A bound set only at run time (``set_key``) on a queue
whose config sets none is enforced by the worker alone. The read is advisory: the line may fill
between it and the worker's decision (the worker refuses then), and an unreachable backend
never blocks publishing (the call is sent; logged once per outage).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from .config import QueueConfig
from .engines import engines_of, unproxy
from .errors import FlowControlError, FlowQueueFull, UnknownQueueError

__all__ = ["bounded", "check_room", "check_room_of"]

logger = logging.getLogger(__name__)

#: The apps whose ``FlowControl(app)`` ran in this process (worker/runtime.py's ``install``).
_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()
#: The apps whose last read of a waiting bound failed (an outage is logged once per app).
_DOWN: weakref.WeakSet[Any] = weakref.WeakSet()


def check_room_of(app: Any) -> None:
    """From now on, ``apply_async`` of *app*'s FlowTasks checks waiting bounds (``install``)."""
    _CHECKED.add(app)


def bounded(config: QueueConfig) -> bool:
    """True when *config* bounds how many calls may wait (the queue's, per key, or a key's)."""
    return (config.max_waiting is not None or config.per_key_max_waiting is not None
            or any(k.max_waiting is not None for k in config.keys.values()))


def check_room(app: Any, queue: str | None, key: str | None) -> None:
    """Raise :class:`FlowQueueFull` if the backend would refuse a call of *queue* (and
    fairness key *key*, when the call names one) now; else return."""
    if not queue or unproxy(app) not in _CHECKED:
        return
    engines = engines_of(app)
    config = engines.config_of(queue)
    if config is None or not bounded(config):
        return
    try:
        # A call that names no key gets its own root id as its key at the worker: a fresh
        # key, so only the queue's own bound can refuse it ("" stands for it here).
        refusal: FlowQueueFull | None = engines.backend.would_refuse(queue, key or "")
    except UnknownQueueError:
        return  # not registered yet: no worker has a line for it
    except FlowControlError as exc:
        if unproxy(app) not in _DOWN:
            logger.warning("flowcontrol: can't read queue %s's waiting bound at publish (%s); "
                           "sending anyway: the worker refuses what does not fit", queue, exc)
        _DOWN.add(unproxy(app))
        return
    _DOWN.discard(unproxy(app))
    if refusal is not None:
        raise refusal
