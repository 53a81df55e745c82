"""The values of admission: tickets, slots, decisions, grants, waiters, reports.

Plain frozen data shared by the contract (:mod:`.base`), every backend and the worker, with
the rules that bound them (sizes, priorities, overrides) and the few constants every backend
decides by. Nothing here holds state or talks to a server.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..config import (
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    MAX_KEY_BYTES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RateLimit,
    as_tuple,
    parse_duration,
    parse_rate_limits,
)
from ..errors import CostRefusedError, FlowControlConfigError, FlowQueueFull, InvalidTicketError

#: Reasons a :class:`Denied` can carry.
RATE = "rate"
KEY_RATE = "key-rate"  # a rate window of the ticket's fairness key
CONCURRENCY = "concurrency"
PER_KEY = "per_key"
BACKOFF = "backoff"
PAUSED = "paused"

#: The largest cost a ticket may carry: costs are summed as IEEE doubles in every backend,
#: exact for whole numbers up to 2**53; this leaves room for many of them in one window.
MAX_COST = 1e12

MAX_TASK_ID_BYTES = 255
MAX_LABEL_BYTES = 256
#: How many waiters one decision may grant, and how many saturated keys it may skip, before
#: it stops; the remainder is granted by the next decision or reclaim pass. Bounds the cost
#: of one decision whatever the queue holds.
GRANT_BATCH = 256
KEY_SCAN = 64
#: How much one decision reclaims lazily (per kind) before it decides; ``reclaim`` takes all.
#: Every backend uses the same bound, so a decision costs the same whatever the backend.
LAZY_LIMIT = 16


def _check_text(value: object, *, queue: str, field: str, limit: int, empty: bool) -> str:
    if not isinstance(value, str):
        raise InvalidTicketError(
            f"must be a str, got {type(value).__name__}", queue=queue, field=field
        )
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidTicketError("must be valid Unicode text (it holds a lone surrogate)",
                                 queue=queue, field=field) from None
    if size > limit:
        raise InvalidTicketError(
            f"must be at most {limit} bytes in UTF-8, got {size}", queue=queue, field=field
        )
    if not empty and not value:
        raise InvalidTicketError("must not be empty", queue=queue, field=field)
    return value


@dataclass(frozen=True, slots=True)
class Ticket:
    """One admission request: *task_id* asks for a slot of flow queue *queue*.

    *task_id* is the waiter's identity, its **ticket id**: the Celery task id, but for a retry
    (``protocol.py`` gives a retry a ticket of its own). A denied ticket that comes back with
    the same id keeps its place in line, and a ticket whose id holds a grant confirms it. The
    field keeps the name ``task_id`` in every value type of the contract (``Slot``, ``Grant``,
    ``Waiter``) because custom backends and the conformance kit use it. *instance* is the
    worker instance that will hold the slot. *cost* is what the admission charges each
    ``per="cost"`` rate limit of the queue (``per="call"`` limits count 1): a finite number
    ``> 0`` up to :data:`MAX_COST`, else :class:`CostRefusedError`. Other bad values raise
    :class:`InvalidTicketError` here, before any backend sees them.
    """

    queue: str
    task_id: str
    instance: str
    priority: int = 0
    fairness_key: str = ""
    label: str = ""
    cost: float = 1

    def __post_init__(self) -> None:
        c = self.cost
        if not (c == 1 and type(c) is int) and not (type(c) in (int, float) and 0 < c <= MAX_COST):
            q = self.queue if isinstance(self.queue, str) else repr(self.queue)
            raise CostRefusedError(
                f"must be a finite number > 0 and at most {MAX_COST:g}, got {c!r}", q, "flow_cost")
        q, t, i, k, lb, p = (self.queue, self.task_id, self.instance, self.fairness_key,
                             self.label, self.priority)
        # The common case first, in one expression (every admission builds a ticket): ASCII
        # text, whose length is its size in UTF-8, and an int priority in range.
        if (type(q) is str and q.isascii() and 0 < len(q) <= 64
                and type(t) is str and t.isascii() and 0 < len(t) <= MAX_TASK_ID_BYTES
                and type(i) is str and i.isascii() and 0 < len(i) <= MAX_TASK_ID_BYTES
                and type(k) is str and k.isascii() and len(k) <= MAX_KEY_BYTES
                and type(lb) is str and lb.isascii() and len(lb) <= MAX_LABEL_BYTES
                and type(p) is int and PRIORITY_MIN <= p <= PRIORITY_MAX):
            return
        q = self.queue if isinstance(self.queue, str) else repr(self.queue)
        _check_text(self.queue, queue=q, field="queue", limit=64, empty=False)
        _check_text(self.task_id, queue=q, field="task_id", limit=MAX_TASK_ID_BYTES, empty=False)
        _check_text(self.instance, queue=q, field="instance", limit=MAX_TASK_ID_BYTES, empty=False)
        _check_text(self.fairness_key, queue=q, field="fairness_key", limit=MAX_KEY_BYTES,
                    empty=True)
        _check_text(self.label, queue=q, field="label", limit=MAX_LABEL_BYTES, empty=True)
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, int):
            raise InvalidTicketError(
                f"must be an int, got {type(p).__name__} {p!r}", queue=q, field="priority"
            )
        if not PRIORITY_MIN <= p <= PRIORITY_MAX:
            raise InvalidTicketError(
                f"must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {p}",
                queue=q, field="priority",
            )


@dataclass(frozen=True, slots=True)
class Slot:
    """A busy slot: one unit of a queue's concurrency, held by *holder* for *task_id*."""

    slot_id: str
    queue: str
    holder: str
    task_id: str
    fairness_key: str
    label: str
    acquired_at: float
    expires_at: float | None  # from max_hold, fixed when the slot was granted


@dataclass(frozen=True, slots=True)
class Admitted:
    """The ticket may run now; it holds *slot* until :meth:`AdmissionBackend.release`."""

    slot: Slot

    admitted = True


@dataclass(frozen=True, slots=True)
class Denied:
    """The ticket must wait; it is a waiter now and should come back at *retry_at*.

    *reason* is :data:`RATE` (a window of the queue), :data:`KEY_RATE` (a window of its
    fairness key), :data:`CONCURRENCY`, :data:`PER_KEY`, :data:`BACKOFF` (a backoff in force
    is what holds it longest) or :data:`PAUSED` (an operator's pause of its queue or key:
    *retry_at* is the pause's end, or one ``retry`` from now if it has none). For a rate
    denial *retry_at* is the exact instant every rate limit and backoff admits the ticket's
    cost (a lower bound only where an adaptive limit must first rise).
    """

    retry_at: float
    reason: str

    admitted = False


@dataclass(frozen=True, slots=True)
class Refused:
    """The ticket may not even wait: too many calls of its queue (``max_waiting``) or of its
    key (``keys[k].max_waiting``, else ``per_key_max_waiting``) wait already. It was not put
    in line and holds nothing; :meth:`error` is the :class:`FlowQueueFull` to end it with.
    *field* names the bound that refused it, *bound* its value."""

    queue: str
    key: str
    bound: int
    field: str

    admitted = False

    def error(self) -> FlowQueueFull:
        return FlowQueueFull(self.queue, self.key, self.bound, self.field)


Decision = Admitted | Denied | Refused


@dataclass(frozen=True)
class Grant:
    """A freed slot reserved for waiter *task_id* until *expires_at*.

    *instance* is the worker instance of the waiter's last admission request (the one that
    parked it), where announced: that instance wakes it at once and the others leave it to
    their pending-grant rescue. ``None`` where unknown (``pending_grants``); it is a hint for
    routing the wake-up, so it takes no part in comparisons.
    """

    queue: str
    task_id: str
    slot_id: str
    granted_at: float
    expires_at: float
    instance: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Waiter:
    """A denied ticket waiting for its turn (listed in the order it will be served)."""

    queue: str
    task_id: str
    priority: int
    fairness_key: str
    label: str
    seq: int
    instance: str
    since: float
    expires_at: float
    #: The cost it asked with: a grant goes only to a waiter its key's own limits let in.
    cost: float = 1.0


@dataclass(frozen=True)
class Place:
    """Where one waiter stands in its queue's line: *position* (1 = served next), how many
    of those before it are there by a higher *priority*, and how many are other keys' turns
    (0 in a queue with one line: neither ``fairness="key"`` nor a per-key cap)."""

    position: int
    higher_priority: int
    other_keys: int


@dataclass(frozen=True)
class RateUse:
    """One rate limit of a queue as an operator sees it: how much of it is in use now and,
    for an adaptive limit, its live figure (``None`` otherwise)."""

    rate: RateLimit
    used: float
    live: int | None = None


@dataclass(frozen=True)
class QueueStats:
    """What an operator sees of one queue. ``rate_limit`` and ``rate_used`` are its first
    rate limit's; ``rates`` has every one, and ``backoff_until`` the end of a backoff in
    force (``None`` if none)."""

    name: str
    capacity: int | None
    concurrency: int | None
    capacity_override: int | None
    in_use: int
    granted: int
    waiting: int
    rate_limit: RateLimit | None
    rate_used: float  # a count of calls, or of cost for a per="cost" limit
    max_hold: float | None
    configured_max_hold: float | None
    max_hold_override: float | None
    rates: tuple[RateUse, ...] = ()
    backoff_until: float | None = None
    rate_override: tuple[RateLimit, ...] | None = None
    #: The end of an operator's pause of the queue (``math.inf``: until resumed), or ``None``.
    paused_until: float | None = None
    #: The queue's ``max_waiting``, and how many calls it and its keys' bounds refused.
    max_waiting: int | None = None
    refused: int = 0


@dataclass(frozen=True)
class KeyStats:
    """What an operator sees of one fairness key of a queue: its use, its effective settings
    (its own, else the queue's per-key defaults), a pause in force (``math.inf``: until
    resumed), its admissions in the last 60 s, and whether it has settings of its own
    (``keys=`` or ``set_key``)."""

    key: str
    busy: int
    waiting: int
    weight: float
    concurrency: int | None
    rate_limit: tuple[RateLimit, ...] | None
    reserve: int
    max_waiting: int | None
    paused_until: float | None
    admitted_recent: int
    overridden: bool


@dataclass(frozen=True)
class ReclaimReport:
    """What one reclaim pass took back, by reason."""

    instances: int = 0
    max_hold: int = 0
    grants: int = 0
    waiters: int = 0

    def __add__(self, other: ReclaimReport) -> ReclaimReport:
        return ReclaimReport(self.instances + other.instances, self.max_hold + other.max_hold,
                             self.grants + other.grants, self.waiters + other.waiters)

    @property
    def total(self) -> int:
        return self.instances + self.max_hold + self.grants + self.waiters


GrantCallback = Callable[[Grant], None]


def queue_of_slot(slot_id: str) -> str | None:
    """The queue name a slot id belongs to (slot ids are ``"<queue>:<n>"``), or ``None``."""
    if not isinstance(slot_id, str):
        return None
    queue, sep, rest = slot_id.rpartition(":")
    return queue if sep and queue and rest.isdigit() else None


def sequence_floor(now: float) -> int:
    """Where the slot sequence of a queue that :meth:`AdmissionBackend.restore` re-creates
    starts: *now* in whole microseconds (whole milliseconds times 1000, computed the same in
    every backend). Below 2**53 (exact in a double) until the year 2255."""
    return math.floor(now * 1000) * 1000


def restorable(queue: str, slots: Iterable[Slot]) -> list[tuple[Slot, int]]:
    """The slots of *queue* :meth:`AdmissionBackend.restore` may record, each with the
    number of its id (``"<queue>:<n>"``, ``n`` below 2**53); others are left out."""
    out = []
    for s in slots:
        if s.queue != queue or queue_of_slot(s.slot_id) != queue:
            continue
        n = s.slot_id.rpartition(":")[2]
        if n.isascii() and len(n) <= 16 and int(n) < 2 ** 53:
            out.append((s, int(n)))
    return out


def check_capacity_override(queue: str, capacity: object) -> int | None:
    """Validate an operator's capacity override (``None`` resets it)."""
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not (
            0 <= capacity <= MAX_CONCURRENCY):
        raise FlowControlConfigError(
            f"override must be an int between 0 and {MAX_CONCURRENCY}, got {capacity!r}",
            queue, "capacity")
    return capacity


def check_rate_override(queue: str, value: object) -> tuple[RateLimit, ...] | None:
    """Validate an operator's rate limit override, in every form ``rate_limit`` takes (one
    limit or a list); ``None`` resets it. Always a tuple of limits."""
    rates = parse_rate_limits(value, queue, "rate_limit")
    return None if rates is None else as_tuple(rates)


def check_max_hold_override(queue: str, seconds: object) -> float | None:
    """Validate an operator's max_hold override (``None`` resets it)."""
    if seconds is None:
        return None
    value = parse_duration(seconds, queue=queue, field="max_hold")
    if not 0 < value <= MAX_HOLD_LIMIT:
        raise FlowControlConfigError(
            f"override must be more than 0 and at most {MAX_HOLD_LIMIT:g} s, got {seconds!r}",
            queue, "max_hold")
    return value


__all__: Sequence[str] = (
    "Admitted", "Denied", "Decision", "KeyStats", "Refused", "PAUSED", "Grant", "GrantCallback",
    "QueueStats", "ReclaimReport",
    "Place", "RateUse", "Slot", "Ticket", "Waiter", "RATE", "CONCURRENCY", "PER_KEY", "BACKOFF",
    "KEY_RATE", "MAX_COST", "GRANT_BATCH", "KEY_SCAN",
    "LAZY_LIMIT", "MAX_TASK_ID_BYTES", "MAX_LABEL_BYTES", "queue_of_slot",
    "check_capacity_override", "check_max_hold_override", "check_rate_override", "restorable",
    "sequence_floor",
)
