"""One row per flow queue: ``flowcontrol list``, the dashboard's queues page, the gauges."""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.values import QueueStats, RateUse
from ..config import QueueConfig, RateLimit
from ..errors import FlowControlError, UnknownQueueError

__all__ = ["QueueRow", "RateRow", "limit_text", "queue_names", "queue_rows", "queue_row",
           "rate_text"]


def limit_text(rl: RateLimit) -> str:
    """``"20/2s"``-style text of one rate limit, with what is not the default after it
    (``"200000/60s cost"``, ``"10/1s gcra burst 5"``, ``"500/60s adaptive"``)."""
    extra = [] if rl.algorithm == "fixed" else [rl.algorithm]
    if rl.algorithm == "gcra" and rl.burst != 1:
        extra.append(f"burst {rl.burst}")
    if rl.per == "cost":
        extra.append("cost")
    if rl.adaptive:
        extra.append("adaptive")
    return " ".join([f"{rl.limit}/{rl.period:g}s", *extra])


def rate_text(stats: QueueStats) -> str | None:
    """``"20/2s"``-style text of a queue's (first) rate limit, or ``None``."""
    return None if stats.rate_limit is None else limit_text(stats.rate_limit)


@dataclass(frozen=True)
class RateRow:
    """One rate limit of a queue: its text, its figure (the ceiling, when adaptive), how much
    of it is in use, and an adaptive limit's live figure."""

    limit: str
    count: int
    used: float
    live: int | None

    def text(self) -> str:
        """``"3 of 5/10s"``, ``"120 of 500/60s adaptive (live 250)"``."""
        used = f"{self.used:g}" if isinstance(self.used, float) else str(self.used)
        live = "" if self.live is None else f" (live {self.live})"
        return f"{used} of {self.limit}{live}"


@dataclass(frozen=True)
class QueueRow:
    """One line of ``flowcontrol list`` and of the dashboard's queues page."""

    name: str
    capacity: int | None
    concurrency: int | None
    capacity_override: int | None
    in_use: int
    granted: int
    waiting: int
    parked: int | None  # None when the parking database can't be read
    rate_limit: str | None
    rate_limit_count: int | None
    rate_used: float
    max_hold: float | None
    configured_max_hold: float | None
    max_hold_override: float | None
    rates: tuple[RateRow, ...] = ()
    rate_override: bool = False
    backoff_until: float | None = None  # the end of a backoff in force
    #: The end of a pause of the whole queue (``pause``): inf until resumed; None: not paused.
    paused_until: float | None = None
    max_waiting: int | None = None  # the queue's bound on waiting calls, if any
    refused: int = 0  # calls refused for a full waiting bound (FlowQueueFull), as counted
    #: False for a queue of ``flowcontrol_queues`` that no worker has registered in the
    #: backend yet: its figures are its config's, nothing is in use.
    registered: bool = True

    @property
    def overrides(self) -> list[str]:
        """Which values are operator overrides (they win over config until reset)."""
        return [n for n, v in (("capacity", self.capacity_override),
                               ("max_hold", self.max_hold_override),
                               ("rate_limit", True if self.rate_override else None))
                if v is not None]

    def rates_text(self) -> str:
        """Every limit's use, ``"3 of 5/10s, 120 of 200000/60s cost"``; ``"-"`` for none."""
        return ", ".join(r.text() for r in self.rates) or "-"

    @property
    def paused(self) -> bool:
        """True while the whole queue is paused."""
        return self.paused_until is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the ``overrides`` list and ``paused`` (an open-ended pause's
        ``paused_until`` is ``null``: JSON has no infinity)."""
        data = {**asdict(self), "overrides": self.overrides, "paused": self.paused}
        if self.paused_until is not None and math.isinf(self.paused_until):
            data["paused_until"] = None
        return data


def _row(stats: QueueStats, parked: int | None, registered: bool = True) -> QueueRow:
    return QueueRow(
        name=stats.name, capacity=stats.capacity, concurrency=stats.concurrency,
        capacity_override=stats.capacity_override, in_use=stats.in_use, granted=stats.granted,
        waiting=stats.waiting, parked=parked, rate_limit=rate_text(stats),
        rate_limit_count=None if stats.rate_limit is None else stats.rate_limit.limit,
        rate_used=stats.rate_used, max_hold=stats.max_hold,
        configured_max_hold=stats.configured_max_hold, max_hold_override=stats.max_hold_override,
        rates=tuple(RateRow(limit_text(u.rate), u.rate.limit, u.used, u.live) for u in stats.rates),
        rate_override=stats.rate_override is not None, backoff_until=stats.backoff_until,
        paused_until=stats.paused_until, max_waiting=stats.max_waiting, refused=stats.refused,
        registered=registered)


def _parked_counts(fc: Any) -> dict[str, int] | None:
    try:
        return dict(fc.store.counts())
    except FlowControlError:
        return None  # the figures of the backend are still worth showing


def _configured_stats(config: QueueConfig) -> QueueStats:
    """What a queue's config alone says of it: its limits, nothing in use."""
    limits = config.rate_limits
    return QueueStats(
        name=config.name, capacity=config.concurrency, concurrency=config.concurrency,
        capacity_override=None, in_use=0, granted=0, waiting=0,
        rate_limit=limits[0] if limits else None, rate_used=0, max_hold=config.max_hold,
        configured_max_hold=config.max_hold, max_hold_override=None,
        rates=tuple(RateUse(rl, 0) for rl in limits), max_waiting=config.max_waiting)


def _unregistered(fc: Any, names: list[str]) -> dict[str, QueueConfig]:
    """The queues of this app's ``flowcontrol_queues`` that the backend does not know yet."""
    known = set(names)
    return {c.name: c for c in fc.settings.queues if c.name not in known}


def queue_names(fc: Any, limit: int | None = None, after: str | None = None, *,
                configured: bool = False) -> list[str]:
    """The names of one page of queues: by name, those after *after*, at most *limit*.

    With *configured*, the queues of the app's ``flowcontrol_queues`` that no worker has
    registered yet are among them."""
    names = fc.backend.queues()  # sorted; one SMEMBERS, cheap even at 10,000 names
    if configured:
        names = sorted([*names, *_unregistered(fc, names)])
    if after is not None:
        names = names[bisect.bisect_right(names, after):]
    return names if limit is None else names[:limit]


def queue_rows(fc: Any, limit: int | None = None, after: str | None = None, *,
               configured: bool = False) -> list[QueueRow]:
    """Every queue the backend knows, by name (one page of them with *limit* and *after*,
    see :func:`queue_names`); a queue dropped meanwhile is skipped. With *configured*, the
    app's configured queues that no worker registered yet come too, ``registered=False``."""
    counts = _parked_counts(fc)
    rows = []
    pending = _unregistered(fc, fc.backend.queues()) if configured else {}
    # One stats call per row: a page bounds the time a fleet of 10,000 queues takes to list.
    for name in queue_names(fc, limit, after, configured=configured):
        parked = None if counts is None else counts.get(name, 0)
        if name in pending:
            rows.append(_row(_configured_stats(pending[name]), parked, registered=False))
            continue
        try:
            stats = fc.backend.stats(name)
        except UnknownQueueError:
            continue  # unregistered between queues() and stats()
        rows.append(_row(stats, parked))
    return rows


def queue_row(fc: Any, name: str, *, configured: bool = False) -> QueueRow:
    """One queue; :class:`UnknownQueueError` if the backend does not know it (with
    *configured*, only if this app does not configure it either: ``registered=False`` then)."""
    registered = True
    try:
        stats = fc.backend.stats(name)
    except UnknownQueueError:
        config = next((c for c in fc.settings.queues if c.name == name), None) if configured else None
        if config is None:
            raise
        stats, registered = _configured_stats(config), False
    try:
        parked: int | None = fc.store.count(name)
    except FlowControlError:
        parked = None
    return _row(stats, parked, registered)
