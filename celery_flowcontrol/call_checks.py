"""What ``FlowTask.apply_async`` checks of a call's flow options before anything is sent.

A bad per-call option (:func:`check_flow_options`), a ``flow_cost`` or ``fairness_key``
callable that raises or returns a bad value (:func:`evaluate`, :func:`check_key`), a cost no
limit of the queue can ever admit (:func:`check_cost`): each is refused at the producer with
an error naming the task, the queue and the field. A ``flow_queue`` no queue of the app's
config names is reported as ``flowcontrol_unknown_queues`` says (:func:`check_queue_known`).
"""

from __future__ import annotations

import difflib
import logging
import weakref
from typing import Any

from .admission.values import MAX_COST
from .config import MAX_KEY_BYTES, NAME_RE, PRIORITY_MAX, PRIORITY_MIN
from .engines import engines_of
from .errors import CostRefusedError, FlowControlConfigError, InvalidTicketError

__all__ = ["check_cost", "check_flow_options", "check_key", "check_queue_known", "default_of",
           "evaluate"]

logger = logging.getLogger(__name__)
#: Per app, the unknown flow queue names already warned of (once per name and process).
_WARNED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def check_flow_options(queue: Any, priority: Any, key: Any) -> None:
    """Refuse bad per-call flow options at the producer, naming the field."""
    q = queue if isinstance(queue, str) else None
    if queue is not None and not (isinstance(queue, str) and NAME_RE.fullmatch(queue)):
        raise InvalidTicketError(f"must be a flow queue name matching {NAME_RE.pattern}, "
                                 f"got {queue!r}", q, "flow_queue")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not PRIORITY_MIN <= priority <= PRIORITY_MAX):
        raise InvalidTicketError(f"must be an int between {PRIORITY_MIN} and {PRIORITY_MAX}, "
                                 f"got {priority!r}", q, "flow_priority")
    if key is not None and (not isinstance(key, str)
                            or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES):
        raise InvalidTicketError(f"must be a str of at most {MAX_KEY_BYTES} UTF-8 bytes, "
                                 f"got {type(key).__name__} {str(key)[:40]!r}", q, "fairness_key")


def default_of(task: Any, name: str) -> Any:
    """The decorator default *name* of *task* as it was given: Celery makes the options of
    ``@app.task`` class attributes, so a function given there reads back bound to the task
    (``self.flow_cost(args, kwargs)`` would pass three arguments)."""
    if name in vars(task):
        return vars(task)[name]
    for klass in type(task).__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return value.__func__ if isinstance(value, staticmethod) else value
    return None


def evaluate(task: Any, field: str, value: Any, args: Any, kwargs: Any, queue: str | None) -> Any:
    """*value*, or what it returns for ``(args, kwargs)`` when it is a callable (a
    ``flow_cost`` or ``fairness_key`` computed per call); a callable that raises is an
    :class:`InvalidTicketError` naming the task, the queue and the field."""
    if not callable(value):
        return value
    try:
        return value(tuple(args or ()), dict(kwargs or {}))
    except Exception as exc:
        raise InvalidTicketError(f"task {task.name!r}: the {field} callable raised "
                                 f"{type(exc).__name__}: {exc}", queue, field) from exc


def check_cost(task: Any, queue: str | None, cost: Any) -> int | float:
    """*cost* if one admission through *queue* can take it: a finite number > 0, and no more
    than a ``per="cost"`` limit of the queue (as this process knows its config) admits at
    once; else :class:`CostRefusedError` naming the task, the queue and the limit."""
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost <= MAX_COST:
        raise CostRefusedError(f"task {task.name!r}: must be a finite number > 0 and at most "
                               f"{MAX_COST:g}, got {cost!r}", queue, "flow_cost")
    config = engines_of(task.app).config_of(queue) if queue else None
    most, rate = config.cost_limit() if config is not None else (MAX_COST, None)
    if rate is not None and cost > most:
        raise CostRefusedError(f"task {task.name!r}: cost {cost:g} is above what the limit "
                               f"{rate.describe()} admits at once ({most:g}): it can never "
                               "run", queue, "flow_cost")
    return cost


def check_key(task: Any, queue: str | None, key: Any) -> str:
    """A fairness key a callable computed: text of at most 256 UTF-8 bytes."""
    if not isinstance(key, str) or len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidTicketError(f"task {task.name!r}: the fairness_key callable must return a "
                                 f"str of at most {MAX_KEY_BYTES} UTF-8 bytes, got "
                                 f"{type(key).__name__} {str(key)[:40]!r}", queue, "fairness_key")
    return key


def check_queue_known(task: Any, queue: str) -> None:
    """Report a ``flow_queue`` that names no queue this producer knows, as
    ``flowcontrol_unknown_queues`` says: ``"warn"`` (once per name), ``"error"`` (a
    :class:`FlowControlConfigError` naming the task and the queue) or ``"ignore"``. A worker
    runs such a task ungated. Known: a queue of ``flowcontrol_queues``, a serial task's queue,
    or one the backend has registered at run time. An app that configures no queue knows none,
    and says nothing."""
    settings = engines_of(task.app).settings  # a bad config raises here, in the producer too
    policy = settings.unknown_queues
    if policy == "ignore" or not settings.queues or queue.startswith("serial."):
        return
    names = [c.name for c in settings.queues]
    warned = _WARNED.setdefault(task.app, set())
    if queue in names or (policy == "warn" and queue in warned):
        return
    if engines_of(task.app).config_of(queue) is not None:  # registered at run time
        return
    close = difflib.get_close_matches(queue, names, n=1)
    detail = (f"task {task.name!r}: flow_queue {queue!r} names no queue of flowcontrol_queues"
              + (f" (did you mean {close[0]!r}?)" if close else f" ({', '.join(names)})")
              + "; a worker would run it ungated")
    if policy == "error":
        raise FlowControlConfigError(detail, queue, "flow_queue")
    warned.add(queue)
    logger.warning("flowcontrol: %s (said once per name; flowcontrol_unknown_queues=\"error\" "
                   "refuses to send it, \"ignore\" says nothing)", detail)
