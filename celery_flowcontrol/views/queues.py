"""One row per flow queue: ``flowcontrol list``, the dashboard's queues page, the gauges."""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.values import QueueStats
from ..errors import FlowControlError, UnknownQueueError

__all__ = ["QueueRow", "queue_names", "queue_rows", "queue_row", "rate_text"]


def rate_text(stats: QueueStats) -> str | None:
    """``"20/2s"``-style text of a queue's rate limit, or ``None``."""
    rl = stats.rate_limit
    if rl is None:
        return None
    return f"{rl.limit}/{rl.period:g}s" + ("" if rl.algorithm == "fixed" else f" {rl.algorithm}")


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


def queue_names(fc: Any, limit: int | None = None, after: str | None = None) -> list[str]:
    """The names of one page of queues: by name, those after *after*, at most *limit*."""
    names = fc.backend.queues()  # sorted; one SMEMBERS, cheap even at 10,000 names
    if after is not None:
        names = names[bisect.bisect_right(names, after):]
    return names if limit is None else names[:limit]


def queue_rows(fc: Any, limit: int | None = None, after: str | None = None) -> list[QueueRow]:
    """Every queue the backend knows, by name (one page of them with *limit* and *after*,
    see :func:`queue_names`); a queue dropped meanwhile is skipped."""
    counts = _parked_counts(fc)
    rows = []
    # One stats call per row: a page bounds the time a fleet of 10,000 queues takes to list.
    for name in queue_names(fc, limit, after):
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
