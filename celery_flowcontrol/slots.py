"""Slots that outlive a task: ``release_slot``, ``acquire_slot`` and ``with_limit``.

A flow queue with ``release="manual"`` caps work that starts in one task and ends in another
(a phone call placed by one task and ended by a webhook's task). The task admitted through
it finds its slot id in ``self.request.flow_slot``; the slot stays busy after the task
returns, until ``release_slot(slot_id)`` (from any task, any process, or the CLI) or until
``max_hold`` takes it back::

    @app.task(base=FlowTask, flow_queue="calls", bind=True)
    def place_call(self, number):
        provider.dial(number, metadata={"slot": self.request.flow_slot})

    @app.task(base=FlowTask)
    def call_ended(slot_id):
        release_slot(slot_id)

Inside a task, ``acquire_slot(name)`` takes a slot of another queue. When none is free the
task is *parked*, not blocked in a pool process: the current run ends (Celery's ``Ignore``:
no result is stored, nothing is retried), and the task runs again **from the start** once a
slot is granted; the call then returns that slot. Code before the call therefore runs again:
keep it idempotent, or call ``acquire_slot`` first. ``with_limit(name)`` is the same as a
context manager that releases the slot when the block ends.

All three run where ``current_app`` is the task's app, so they take the queue or slot first
and ``app=`` keyword-only (default: the current app), like ``settle_cost``; ``timeout`` and
``label`` are keyword-only too (docs/architecture.md, "The public surface").
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from celery import current_app
from celery.exceptions import Ignore

from .config import parse_duration
from .errors import FlowControlError, SlotTimeoutError, UnknownQueueError
from .protocol import ACQUIRE_HEADER, REQUEST_KEYS

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _keyword_options(*order: str) -> Callable[[F], F]:
    """Keep a call that passes options after the queue name positionally, in *order* (how the
    function took them before they became keyword-only), working, with a DeprecationWarning:
    ``acquire_slot`` took ``(name, timeout, label)`` and ``with_limit`` ``(name, label,
    timeout)``, so a positional call meant different things to the two."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(name: str, *args: Any, **kwargs: Any) -> Any:
            if args:
                if len(args) > len(order):
                    raise TypeError(f"{fn.__name__}() takes the queue name positionally and "
                                    f"{', '.join(order)} by keyword")
                given = dict(zip(order[:len(args)], args, strict=True))
                for option in given:
                    if option in kwargs:
                        raise TypeError(f"{fn.__name__}() got multiple values for {option!r}")
                warnings.warn(f"{fn.__name__}(name, {', '.join(given)}) positionally is "
                              f"deprecated: pass {', '.join(o + '=' for o in given)} by "
                              "keyword", DeprecationWarning, stacklevel=2)
                kwargs.update(given)
            return fn(name, **kwargs)
        return cast(F, call)
    return wrap


@dataclass(frozen=True)
class ReleaseResult:
    """What :func:`release_slot` did: ``released`` is False when the slot was not busy
    (released before, taken back by ``max_hold``, or never existed)."""

    slot_id: str
    released: bool

    def __bool__(self) -> bool:
        return self.released


def release_slot(slot_id: str, *, app: Any = None) -> ReleaseResult:
    """Free slot *slot_id*, wherever it was taken; idempotent (see :class:`ReleaseResult`)."""
    from .flowcontrol import FlowControl

    control = FlowControl(app or current_app)
    return ReleaseResult(slot_id, bool(control.call_backend("release", slot_id=slot_id)))


@_keyword_options("timeout", "label")
def acquire_slot(name: str, *, timeout: float | str = "30m", label: str = "",
                 app: Any = None) -> str:
    """Take a slot of flow queue *name* inside a task; returns its slot id.

    Parks the task and runs it again from the start when no slot is free (module
    docstring). Raises :class:`SlotTimeoutError` when *timeout* passes first (the waiter
    leaves the queue) and :class:`UnknownQueueError` for a queue nobody registered.

    :param name: the flow queue.
    :param timeout: the longest the task waits, from its first call (seconds or ``"30m"``).
    :param label: shown next to the slot by the CLI and the dashboard.
    :param app: the Celery app (default: the current one).
    """
    from .task import FlowTask

    task = (app or current_app).current_task  # the task running on this thread, or None
    if task is None or task.request.called_directly:
        raise FlowControlError("acquire_slot() must be called inside a task run by a worker")
    if not isinstance(task, FlowTask):
        raise FlowControlError(f"acquire_slot() needs base=FlowTask on task {task.name}")
    seconds = parse_duration(timeout, queue=name, field="timeout")
    request = task.request
    acquired = getattr(request, "flow_acquired", None) or {}
    if name in acquired:
        return str(acquired[name])
    if name in (getattr(request, "flow_acquire_unknown", None) or ()):
        raise UnknownQueueError(name)
    if name in (getattr(request, "flow_acquire_expired", None) or ()):
        raise SlotTimeoutError(name, seconds)
    headers = {k: v for k, v in (request.headers or {}).items() if k not in REQUEST_KEYS}
    pending = dict(headers.get(ACQUIRE_HEADER) or {})
    pending.setdefault(name, {"deadline": time.time() + seconds, "label": label})
    headers[ACQUIRE_HEADER] = pending
    # The same message again, with what it waits for: the worker's gate admits it (now, or
    # when a slot is granted) and this run ends without a result.
    task.signature_from_request(request, headers=headers).apply_async()
    raise Ignore()


@_keyword_options("label", "timeout")
@contextmanager
def with_limit(name: str, *, timeout: float | str = "30m", label: str = "",
               app: Any = None) -> Iterator[str]:
    """``acquire_slot`` as a context manager: the slot is released when the block ends.
    The same keyword-only options as :func:`acquire_slot`."""
    slot_id = acquire_slot(name, timeout=timeout, label=label, app=app)
    try:
        yield slot_id
    finally:
        try:
            release_slot(slot_id, app=app)
        except FlowControlError as exc:
            # The block's work is done; don't fail it for the release. The slot goes back
            # when the task's result lands (on_result queues) or at its max_hold.
            logger.warning("flowcontrol: release of %s after with_limit failed: %s", slot_id, exc)
