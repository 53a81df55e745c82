"""Every error celery-flowcontrol raises: one root, :class:`FlowControlError`, and its subclasses.

The errors carry structured fields (``queue``, ``field``, ``timeout``, ``extra``) so callers can
branch on them without parsing messages. Each subclass keeps its structured fields in
``self.args`` in constructor order, because that is what survives a trip through a Celery result
backend: Celery rebuilds a remote exception as ``cls(*exc.args)`` (JSON) or unpickles it, and a
keyword-only field would be lost on the way. ``__str__`` builds the readable message from them.

This module imports nothing from Celery or from the rest of the package.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailableError",
    "CollapseError",
    "CostRefusedError",
    "FlowControlConfigError",
    "FlowControlError",
    "FlowQueueFull",
    "InvalidTicketError",
    "MissingDependencyError",
    "ParkingRejectedError",
    "ParkingUnavailableError",
    "SettleError",
    "SlotTimeoutError",
    "UnknownDeadLetterError",
    "UnknownQueueError",
    "UnknownSlotError",
]


class FlowControlError(Exception):
    """Root of every error raised by celery-flowcontrol; catch this to catch them all."""


def _where(queue: str | None, field: str | None) -> str:
    """Prefix naming the queue and field an error is about, e.g. ``flow queue 'emails': field 'x': ``."""
    parts = []
    if queue is not None:
        parts.append(f"flow queue {queue!r}")
    if field is not None:
        parts.append(f"field {field!r}")
    return "".join(part + ": " for part in parts)


class _QueueFieldError(FlowControlError):
    """Shared shape of errors about one field of one flow queue: ``detail``, ``queue``, ``field``."""

    def __init__(self, detail: str, queue: str | None = None, field: str | None = None) -> None:
        super().__init__(detail, queue, field)
        self.detail = detail
        self.queue = queue
        self.field = field

    def __str__(self) -> str:
        return _where(self.queue, self.field) + self.detail


class FlowControlConfigError(_QueueFieldError, ValueError):
    """A queue config or ``flowcontrol_*`` setting is invalid.

    ``queue`` is the flow queue's name (``None`` for app-wide settings) and ``field`` the field or
    setting at fault (``"concurrency"``, ``"rate_limit.period"``, ``"flowcontrol_grant_ttl"``).
    ``detail`` says what was given and what is allowed; ``str(err)`` names all three::

        flow queue 'emails': field 'concurrency': must be an int between 1 and 100000, got 0
    """


class InvalidTicketError(_QueueFieldError, ValueError):
    """Bad per-call input at the admission boundary: a priority that is not an int, a key too long.

    Same shape as :class:`FlowControlConfigError` (``detail``, ``queue``, ``field``), but about one
    call's options (``flow_priority``, ``fairness_key``) rather than about configuration.
    """


class CostRefusedError(_QueueFieldError):
    """A task's cost can never be admitted: not a finite positive number, or above what a
    ``per="cost"`` limit of its queue (its limit, or a GCRA limit's burst) admits at once.

    Not an outage and not a wait: retrying won't help. At publish nothing is sent; a message
    that reaches a worker with one is dead-lettered, never run past the limit. ``field`` is
    the option at fault (``"flow_cost"``), ``detail`` names the value and the limit. Not an
    :class:`InvalidTicketError` on purpose: bad options of that kind run ungated, this must
    not run at all.
    """


class FlowQueueFull(FlowControlError):
    """A call was refused because too many calls wait already: the queue's ``max_waiting``,
    or its key's bound (``keys['k'].max_waiting``, else ``per_key_max_waiting``).

    ``queue``, ``key`` (the call's fairness key, ``None`` when unknown), ``bound`` (the number
    of waiting calls allowed) and ``field`` (``"max_waiting"``, ``"per_key_max_waiting"`` or
    ``"keys['k'].max_waiting"``). The call never runs and is never parked.
    """

    def __init__(self, queue: str, key: str | None, bound: int, field: str) -> None:
        super().__init__(queue, key, bound, field)
        self.queue = queue
        self.key = key
        self.bound = bound
        self.field = field

    def __str__(self) -> str:
        whose = "the queue" if self.field == "max_waiting" else f"key {self.key!r}"
        return (f"flow queue {self.queue!r}: key {self.key!r}: refused: {whose} has {self.bound} "
                f"calls waiting already, its bound ({self.field} = {self.bound})")


class SettleError(FlowControlError):
    """``settle_cost`` was refused: outside a running flow task, a second time for one
    admission, or with a value that is not a finite number >= 0. Nothing was changed.

    ``slot_id`` names the admission when known.
    """

    def __init__(self, detail: str, slot_id: str | None = None) -> None:
        super().__init__(detail, slot_id)
        self.detail = detail
        self.slot_id = slot_id

    def __str__(self) -> str:
        return (f"slot {self.slot_id!r}: " if self.slot_id is not None else "") + self.detail


class UnknownQueueError(FlowControlError):
    """A flow queue name was used that was never registered."""

    def __init__(self, queue: str, detail: str | None = None) -> None:
        super().__init__(queue, detail)
        self.queue = queue
        self.detail = detail

    def __str__(self) -> str:
        return f"flow queue {self.queue!r}: " + (self.detail or "is not registered")


class UnknownSlotError(FlowControlError):
    """A slot id that is not busy: released before, reclaimed, or never existed (the
    operators' release, ``celery flowcontrol release`` and the dashboard, says so)."""

    def __init__(self, slot_id: str,
                 detail: str = "is not busy (released, reclaimed, or never existed)") -> None:
        super().__init__(slot_id, detail)
        self.slot_id = slot_id
        self.detail = detail

    def __str__(self) -> str:
        return f"slot {self.slot_id!r} {self.detail}"


class CollapseError(FlowControlError, ValueError):
    """A collapse option of a task (``flow_unique``, ``flow_debounce``, their keys and
    bounds) can't be used for this call: ``detail``, ``task``, ``option``. Raised at
    publish, before anything is sent (docs/collapse.md)."""

    def __init__(self, detail: str, task: str | None = None, option: str | None = None) -> None:
        super().__init__(detail, task, option)
        self.detail = detail
        self.task = task
        self.option = option

    def __str__(self) -> str:
        return f"task {self.task!r}: option {self.option!r}: {self.detail}"


class UnknownDeadLetterError(FlowControlError):
    """Dead-letter ids that are not in the dead-letter table (requeued or never there);
    ``ids`` lists them."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(ids)
        self.ids = list(ids)

    def __str__(self) -> str:
        listed = ", ".join(str(i) for i in self.ids)
        return (f"no dead letter with id {listed} (requeued already, or never there: "
                "`celery flowcontrol dead` lists them)")


class BackendUnavailableError(FlowControlError):
    """The admission backend cannot be reached (wraps e.g. redis' ``ConnectionError``)."""


class ParkingUnavailableError(FlowControlError):
    """The SQL database holding parked messages cannot be reached."""


class ParkingRejectedError(FlowControlError):
    """A message that can never be parked (a value too long, of the wrong type, or refused by the
    database's constraints). Not an outage: retrying won't help, so dead-letter it.

    ``task_id`` and ``field`` name what was refused when known.
    """

    def __init__(self, detail: str, task_id: str | None = None, field: str | None = None) -> None:
        super().__init__(detail, task_id, field)
        self.detail = detail
        self.task_id = task_id
        self.field = field

    def __str__(self) -> str:
        where = f"parked message {self.task_id!r}: " if self.task_id is not None else ""
        where += f"field {self.field!r}: " if self.field is not None else ""
        return where + self.detail


class SlotTimeoutError(FlowControlError):
    """``acquire_slot(queue, timeout=...)`` gave up: no slot was granted within ``timeout`` seconds."""

    def __init__(self, queue: str, timeout: float | None = None) -> None:
        super().__init__(queue, timeout)
        self.queue = queue
        self.timeout = timeout

    def __str__(self) -> str:
        within = "" if self.timeout is None else f" within {self.timeout:g} s"
        return f"flow queue {self.queue!r}: no slot was granted{within}"

    @classmethod
    def is_(cls, exc: BaseException | None) -> bool:
        """True if *exc* is a SlotTimeoutError, from this module or not.

        Matching is by class name, not identity: a result backend may hand the exception back
        as a class from another copy of this module, or (when the caller never imported
        ``celery_flowcontrol.errors``) as a class Celery creates on the fly with the same name
        and only ``args``. So this accepts any exception with a class named ``SlotTimeoutError``
        in its MRO whose queue is known: a ``.queue`` attribute, or a str first argument.
        Celery's pickle fallback, ``UnpickleableExceptionWrapper``, is recognised too.
        """
        if exc is None:
            return False
        if getattr(exc, "exc_cls_name", None) == cls.__name__:
            args: Any = getattr(exc, "exc_args", None) or ()
            return bool(args) and isinstance(args[0], str)
        if not any(klass.__name__ == cls.__name__ for klass in type(exc).__mro__):
            return False
        if isinstance(getattr(exc, "queue", None), str):
            return True
        return bool(exc.args) and isinstance(exc.args[0], str)


class MissingDependencyError(FlowControlError, ImportError):
    """An optional dependency is not installed; ``extra`` names the extra that brings it in.

    >>> str(MissingDependencyError("redis", "redis"))
    "the 'redis' module is not installed: pip install 'celery-flowcontrol[redis]'"
    """

    def __init__(self, extra: str, module: str | None = None) -> None:
        super().__init__(extra, module)
        self.extra = extra
        self.module = module

    def __str__(self) -> str:
        what = f"the {self.module!r} module is" if self.module else "an optional dependency is"
        return f"{what} not installed: pip install 'celery-flowcontrol[{self.extra}]'"
