"""What operators see: one read model shared by the CLI, the dashboard and the metrics.

Everything here reads through the :class:`~celery_flowcontrol.FlowControl` facade of the app
(its admission backend and parking store), so it shows whatever installation the app's settings
point at. Nothing here writes, except the three operator actions at the end, which go through
the backend's own API (``release``, ``set_capacity``, ``set_max_hold``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.base import QueueStats, Slot, Waiter, queue_of_slot
from ..errors import FlowControlError, UnknownQueueError
from ..parking import ParkedMessage

__all__ = [
    "QueueRow", "SlotRow", "WaiterRow", "ParkedRow", "queue_rows", "queue_row", "slot_rows",
    "waiter_rows", "parked_rows", "release", "set_capacity", "set_max_hold", "worker_stats",
    "rate_text", "seq_of", "backend_now", "UnknownSlotError",
]


def rate_text(stats: QueueStats) -> str | None:
    """``"20/2s"``-style text of a queue's rate limit, or ``None``."""
    rl = stats.rate_limit
    if rl is None:
        return None
    return f"{rl.limit}/{rl.period:g}s" + ("" if rl.algorithm == "fixed" else f" {rl.algorithm}")


def seq_of(slot_id: str) -> int:
    """The per-queue sequence number of a slot id ``"<queue>:<n>"`` (0 if it has none)."""
    tail = slot_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


@dataclass(frozen=True)
class QueueRow:
    """One line of ``flowcontrol list`` and of the dashboard's queues page."""

    name: str
    capacity: int | None
    configured_capacity: int | None
    capacity_override: int | None
    in_use: int
    granted: int
    waiting: int
    parked: int | None  # None when the parking database can't be read
    rate_limit: str | None
    rate_limit_count: int | None
    rate_used: int
    max_hold: float | None
    configured_max_hold: float | None
    max_hold_override: float | None

    @property
    def overrides(self) -> list[str]:
        """Which values are operator overrides (they win over config until reset)."""
        return [n for n, v in (("capacity", self.capacity_override),
                               ("max_hold", self.max_hold_override)) if v is not None]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the ``overrides`` list."""
        return {**asdict(self), "overrides": self.overrides}


def _row(stats: QueueStats, parked: int | None) -> QueueRow:
    return QueueRow(
        name=stats.name, capacity=stats.capacity, configured_capacity=stats.configured_capacity,
        capacity_override=stats.capacity_override, in_use=stats.in_use, granted=stats.granted,
        waiting=stats.waiting, parked=parked, rate_limit=rate_text(stats),
        rate_limit_count=None if stats.rate_limit is None else stats.rate_limit.limit,
        rate_used=stats.rate_used, max_hold=stats.max_hold,
        configured_max_hold=stats.configured_max_hold, max_hold_override=stats.max_hold_override)


def _parked_counts(fc: Any) -> dict[str, int] | None:
    try:
        return dict(fc.store.counts())
    except FlowControlError:
        return None  # the figures of the backend are still worth showing


def queue_rows(fc: Any) -> list[QueueRow]:
    """Every queue the backend knows, by name; a queue dropped meanwhile is skipped."""
    counts = _parked_counts(fc)
    rows = []
    for name in fc.backend.queues():
        try:
            stats = fc.backend.stats(name)
        except UnknownQueueError:
            continue  # unregistered between queues() and stats()
        rows.append(_row(stats, None if counts is None else counts.get(name, 0)))
    return rows


def queue_row(fc: Any, name: str) -> QueueRow:
    """One queue; :class:`UnknownQueueError` if the backend does not know it."""
    stats = fc.backend.stats(name)
    try:
        parked: int | None = fc.store.count(name)
    except FlowControlError:
        parked = None
    return _row(stats, parked)


@dataclass(frozen=True)
class SlotRow:
    """A busy slot as operators see it: who holds it, for which task, since when."""

    slot_id: str
    holder: str
    task_id: str
    fairness_key: str
    label: str
    acquired_at: float
    age: float
    expires_at: float | None
    expires_in: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class WaiterRow:
    """A waiter, with its place in line (1 = served next)."""

    position: int
    task_id: str
    priority: int
    fairness_key: str
    label: str
    instance: str
    since: float
    age: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def backend_now(fc: Any) -> float:
    """Now, by the backend's clock when it has one (ages must not mix two machines' clocks)."""
    clock = getattr(fc.backend, "clock", None)
    return float(clock()) if callable(clock) else time.time()


def slot_rows(fc: Any, name: str, now: Callable[[], float] | None = None) -> list[SlotRow]:
    """Busy slots of *name*, oldest first."""
    t = now() if now is not None else backend_now(fc)
    slots: list[Slot] = fc.backend.busy_slots(name)
    return [SlotRow(s.slot_id, s.holder, s.task_id, s.fairness_key, s.label, s.acquired_at,
                    max(0.0, t - s.acquired_at), s.expires_at,
                    None if s.expires_at is None else s.expires_at - t) for s in slots]


def waiter_rows(fc: Any, name: str, limit: int = 100,
                now: Callable[[], float] | None = None) -> list[WaiterRow]:
    """Up to *limit* waiters of *name* in the order they will be served."""
    t = now() if now is not None else backend_now(fc)
    waiters: list[Waiter] = fc.backend.waiters(name, limit)
    return [WaiterRow(i, w.task_id, w.priority, w.fairness_key, w.label, w.instance, w.since,
                      max(0.0, t - w.since)) for i, w in enumerate(waiters, 1)]


@dataclass(frozen=True)
class ParkedRow:
    """A parked message, without its body."""

    task_id: str
    task_name: str
    priority: int
    fairness_key: str | None
    reason: str
    wake_at: float
    parked_at: float | None
    attempts: int

    @classmethod
    def of(cls, m: ParkedMessage) -> ParkedRow:
        """The row of parked message *m*."""
        return cls(m.task_id, m.task_name, m.priority, m.fairness_key, m.reason, m.wake_at,
                   m.parked_at, m.attempts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def parked_rows(fc: Any, name: str, limit: int = 50) -> list[ParkedRow]:
    """Up to *limit* parked messages of queue *name*, in wake order."""
    fc.backend.get_config(name)  # an unknown queue is an error, not an empty list
    return [ParkedRow.of(m) for m in fc.store.list(name, limit)]


# -- operator actions --------------------------------------------------------------------------


class UnknownSlotError(FlowControlError):
    """A slot id that is not busy: released before, reclaimed, or never existed."""

    def __init__(self, slot_id: str, detail: str = "is not busy (released, reclaimed, or never existed)"):
        super().__init__(slot_id, detail)
        self.slot_id = slot_id
        self.detail = detail

    def __str__(self) -> str:
        return f"slot {self.slot_id!r} {self.detail}"


def release(fc: Any, slot_id: str) -> str:
    """Release busy slot *slot_id*; returns its queue. :class:`UnknownSlotError` if not busy."""
    queue = queue_of_slot(slot_id)
    if queue is None:
        raise UnknownSlotError(slot_id, "is not a slot id (they look like 'queue:42')")
    fc.backend.get_config(queue)  # UnknownQueueError names the queue
    if not fc.backend.release(slot_id):
        raise UnknownSlotError(slot_id)
    return queue


def set_capacity(fc: Any, name: str, value: str | int | None) -> QueueRow:
    """Override *name*'s capacity (``None`` or ``"reset"`` resets it); the queue's new row."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "reset":
            value = None
        elif text.isdigit():
            value = int(text)
        else:
            fc.backend.get_config(name)
            from ..errors import FlowControlConfigError

            raise FlowControlConfigError(f"override must be an int or 'reset', got {value!r}",
                                         name, "capacity")
    fc.backend.set_capacity(name, value)
    return queue_row(fc, name)


def set_max_hold(fc: Any, name: str, value: str | float | None) -> QueueRow:
    """Override *name*'s max_hold (``None`` or ``"reset"`` resets it); the queue's new row."""
    if isinstance(value, str) and value.strip().lower() == "reset":
        value = None
    fc.backend.set_max_hold(name, value)
    return queue_row(fc, name)


# -- workers -----------------------------------------------------------------------------------


def worker_stats(app: Any, timeout: float = 1.0) -> dict[str, dict[str, Any]]:
    """``flowcontrol_stats`` of every worker that answers within *timeout*: node -> figures."""
    replies = app.control.broadcast("flowcontrol_stats", reply=True, timeout=timeout) or []
    merged: dict[str, dict[str, Any]] = {}
    for reply in replies:
        for node, figures in (reply or {}).items():
            merged[str(node)] = figures if isinstance(figures, dict) else {"reply": figures}
    return dict(sorted(merged.items()))
