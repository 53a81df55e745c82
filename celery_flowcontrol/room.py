"""Room to wait: ``apply_async`` refuses a call that a full waiting bound would refuse anyway.

A queue with ``max_waiting``, ``per_key_max_waiting`` or a key's own ``max_waiting``
(docs/tenants.md) refuses a call that would make more than that many wait. The worker always
does (worker/refusal.py: the task ends FAILURE with ``FlowQueueFull``); a producer that can see
the backend says so at once instead, by raising :class:`~celery_flowcontrol.FlowQueueFull`
from ``apply_async``, so the caller (a web request, say) can answer "try later" while nothing
is sent.

One read (``AdmissionBackend.would_refuse``: one round trip, no state change), and only where it
can matter: ``FlowControl(app)`` installed in this process, and a waiting bound somewhere in
the queue: in its config as this process knows it, or in the backend (a bound another process
set at run time with ``set_key``, or a config registered by a newer deploy). The backend's
answer to the latter (``AdmissionBackend.waiting_bounded``, one plain read) is kept for
:data:`BOUNDS_TTL` per app and queue, so a queue without any bound costs a publish no round
trip, and a bound set elsewhere is seen within that time (one ``set_key`` of this process at
once). The read is advisory: the line may fill between it and the worker's decision (the
worker refuses then), and an unreachable backend never blocks publishing (the call is sent;
logged once per outage).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from .admission.key_rules import waiting_bounded
from .config import QueueConfig
from .engines import Engines, engines_of, unproxy
from .errors import FlowControlError, FlowQueueFull, UnknownQueueError

__all__ = ["BOUNDS_TTL", "bounded", "check_room", "check_room_of", "forget_bounds"]

#: How long (seconds) a producer trusts the backend's word that a queue its config leaves
#: unbounded has no waiting bound either: the most a bound set by another process at run
#: time may go unseen at ``apply_async`` (the worker refuses meanwhile).
BOUNDS_TTL = 1.0

logger = logging.getLogger(__name__)

#: The apps whose ``FlowControl(app)`` ran in this process (worker/runtime.py's ``install``).
_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()
#: The apps whose last read of a waiting bound failed (an outage is logged once per app).
_DOWN: weakref.WeakSet[Any] = weakref.WeakSet()
#: Per app: queue -> (until when it is trusted, the backend's ``waiting_bounded``).
_BOUNDS: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, bool]]] = \
    weakref.WeakKeyDictionary()


def check_room_of(app: Any) -> None:
    """From now on, ``apply_async`` of *app*'s FlowTasks checks waiting bounds (``install``)."""
    _CHECKED.add(app)


def bounded(config: QueueConfig) -> bool:
    """True when *config* bounds how many calls may wait (the queue's, per key, or a key's)."""
    return waiting_bounded(config)


def forget_bounds(app: Any, queue: str) -> None:
    """Drop what *app* read of *queue*'s run-time bounds (this process changed them)."""
    cache = _BOUNDS.get(unproxy(app))
    if cache is not None:
        cache.pop(queue, None)


def _bounded_in_backend(app: Any, engines: Engines, queue: str) -> bool:
    """The backend's ``waiting_bounded(queue)``, read at most once per :data:`BOUNDS_TTL`."""
    cache = _BOUNDS.get(app)
    if cache is None:
        cache = _BOUNDS.setdefault(app, {})
    now = engines.now()
    known = cache.get(queue)
    if known is not None and now < known[0]:
        return known[1]
    answer = False  # also while the backend can't be reached: it is not asked again at once
    try:
        answer = engines.backend.waiting_bounded(queue)
    except UnknownQueueError:
        pass  # not registered yet: no worker has a line for it
    finally:
        cache[queue] = (now + BOUNDS_TTL, answer)
    return answer


def check_room(app: Any, queue: str | None, key: str | None) -> None:
    """Raise :class:`FlowQueueFull` if the backend would refuse a call of *queue* (and
    fairness key *key*, when the call names one) now; else return."""
    if not queue or unproxy(app) not in _CHECKED:
        return
    app = unproxy(app)
    engines = engines_of(app)
    config = engines.config_of(queue)
    if config is None:
        return
    try:
        if not bounded(config) and not _bounded_in_backend(app, engines, queue):
            return
        # A call that names no key gets its own root id as its key at the worker: a fresh
        # key, so only the queue's own bound can refuse it ("" stands for it here).
        refusal: FlowQueueFull | None = engines.backend.would_refuse(queue, key or "")
    except UnknownQueueError:
        return  # not registered yet: no worker has a line for it
    except FlowControlError as exc:
        if app not in _DOWN:
            logger.warning("flowcontrol: can't read queue %s's waiting bound at publish (%s); "
                           "sending anyway: the worker refuses what does not fit", queue, exc)
        _DOWN.add(app)
        return
    _DOWN.discard(app)
    if refusal is not None:
        raise refusal
