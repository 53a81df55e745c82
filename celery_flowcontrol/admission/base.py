"""The admission contract: value types and the :class:`AdmissionBackend` ABC.

Every backend (in-process, Redis, or a user's own) keeps the same contract, stated once here
and proven by :func:`celery_flowcontrol.testing.run_admission_backend_contract`:

1. The rate limit is checked first and blocks every caller equally, whatever its priority.
   A blocked caller learns the exact instant the window allows the next admission.
2. Then concurrency: slots held plus slots granted stay below the capacity (the operator
   override when set, else the configured ``concurrency``; ``None`` means unlimited).
3. Waiters are served in order: higher ``priority`` first; then, under ``fairness="key"``,
   the least recently served ``fairness_key``; then arrival order (``fifo`` or ``lifo``).
   A newcomer is admitted at once only if free slots outnumber the waiters better than it.
4. A slot freed while waiters exist is *granted* to the rightful next waiter and announced to
   grant subscribers at once. Nobody else can take a granted slot; a grant not confirmed
   (by the waiter coming back through :meth:`AdmissionBackend.try_admit`) within
   ``grant_ttl`` passes to the next waiter and the late one goes back in line.
5. :meth:`AdmissionBackend.release` is idempotent by slot id.
6. Slots whose holder instance stopped heartbeating (``instance_ttl``) and slots past their
   ``max_hold`` are free again: checked lazily on every decision and eagerly by ``reclaim``.
7. Raising capacity grants waiters at once; lowering it takes no slot back.
8. ``max_hold`` is read once per slot, when it is granted.
9. Waiters that did not come back within ``waiter_ttl`` after their ``retry_at`` are pruned.
10. Every guarantee holds per backend instance (memory) or across every process sharing the
    backend (Redis), exactly.

Times at this API are float seconds since the epoch, as returned by the backend's clock.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import (
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    MAX_KEY_BYTES,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QueueConfig,
    RateLimit,
    parse_duration,
)
from ..errors import FlowControlConfigError, FlowControlError, InvalidTicketError

#: Reasons a :class:`Denied` can carry.
RATE = "rate"
CONCURRENCY = "concurrency"
PER_KEY = "per_key"

MAX_TASK_ID_BYTES = 255
MAX_LABEL_BYTES = 256
#: How many waiters one decision may grant, and how many saturated keys it may skip, before
#: it stops; the remainder is granted by the next decision or reclaim pass. Bounds the cost
#: of one decision whatever the queue holds.
GRANT_BATCH = 256
KEY_SCAN = 64


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

    *task_id* is the waiter's identity: a denied ticket that comes back with the same id keeps
    its place in line, and a ticket whose id holds a grant confirms it. *instance* is the
    worker instance that will hold the slot. Bad values raise :class:`InvalidTicketError`
    here, before any backend sees them.
    """

    queue: str
    task_id: str
    instance: str
    priority: int = 0
    fairness_key: str = ""
    label: str = ""

    def __post_init__(self) -> None:
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

    *reason* is :data:`RATE`, :data:`CONCURRENCY` or :data:`PER_KEY`. For a rate denial
    *retry_at* is the exact instant the window allows the next admission.
    """

    retry_at: float
    reason: str

    admitted = False


Decision = Admitted | Denied


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


@dataclass(frozen=True)
class QueueStats:
    """What an operator sees of one queue."""

    name: str
    capacity: int | None
    configured_capacity: int | None
    capacity_override: int | None
    in_use: int
    granted: int
    waiting: int
    rate_limit: RateLimit | None
    rate_used: int
    max_hold: float | None
    configured_max_hold: float | None
    max_hold_override: float | None


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


class Subscription(abc.ABC):
    """A live grant subscription; :meth:`close` stops the callbacks."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop delivering grants. Idempotent."""


def queue_of_slot(slot_id: str) -> str | None:
    """The queue name a slot id belongs to (slot ids are ``"<queue>:<n>"``), or ``None``."""
    if not isinstance(slot_id, str):
        return None
    queue, sep, rest = slot_id.rpartition(":")
    return queue if sep and queue and rest.isdigit() else None


class EventLoopCalls(Protocol):
    """What :meth:`AdmissionBackend.on_event_loop` returns: calls answered on the event loop,
    each by a callback that gets the result or the :class:`FlowControlError` it met."""

    #: The event loop's thread: the only one that may call.
    thread: int

    def __len__(self) -> int:
        """Calls sent and not answered yet."""

    def admit(self, ticket: Ticket, done: Callable[[Decision | FlowControlError], None]) -> None:
        """:meth:`AdmissionBackend.try_admit`, answered later."""

    def release(self, slot_id: str, done: Callable[[bool | FlowControlError], None]) -> None:
        """:meth:`AdmissionBackend.release`, answered later."""

    def quiet(self, queue: str) -> bool:
        """True if nobody is known to wait for a slot of *queue*: a release there may be
        answered later (a release whose slot a waiter needs is made at once), and an
        admission there may be asked early (it is the cheap one)."""

    def poll(self) -> None:
        """Hand over the replies already in, without waiting for more."""

    def close(self, timeout: float = 2.0) -> None:
        """Hand over the replies that come within *timeout*; fail the rest."""


class AdmissionBackend(abc.ABC):
    """Decides which task may run now, for every flow queue it knows.

    Construction takes the timing settings: ``instance_ttl`` (seconds a holder's heartbeat
    lasts), ``grant_ttl`` (seconds a grant waits for its waiter) and ``waiter_ttl`` (seconds
    a waiter may overstay its ``retry_at`` before it is pruned), and a ``clock``.
    """

    instance_ttl: float
    grant_ttl: float
    waiter_ttl: float

    # -- queues ---------------------------------------------------------------------------
    @abc.abstractmethod
    def register(self, config: QueueConfig) -> None:
        """Create flow queue ``config.name``, or replace its config (overrides, slots and
        waiters are kept). A capacity raise grants waiters at once."""

    @abc.abstractmethod
    def unregister(self, name: str, only_if_idle: bool = False) -> bool:
        """Forget a queue with all its state; ``False`` when it was not registered, or, with
        *only_if_idle*, when it still has a busy slot, a grant or a waiter (checked and
        removed in one atomic step)."""

    @abc.abstractmethod
    def queues(self) -> list[str]:
        """The names of every registered queue, sorted."""

    @abc.abstractmethod
    def get_config(self, name: str) -> QueueConfig:
        """The registered config of *name*; :class:`UnknownQueueError` if none."""

    # -- the hot path ---------------------------------------------------------------------
    @abc.abstractmethod
    def try_admit(self, ticket: Ticket) -> Decision:
        """Admit *ticket* now (:class:`Admitted`) or make it a waiter (:class:`Denied`).

        One atomic decision. A ticket whose task id already holds a slot of the queue gets
        that slot again (a redelivered message is admitted once), under a fresh id unless the
        queue is ``release="manual"``, so a late release by the earlier delivery finds
        nothing; one holding a grant confirms it. Raises :class:`UnknownQueueError` for a queue never registered.
        """

    @abc.abstractmethod
    def release(self, slot_id: str) -> bool:
        """Free a slot; grant it to the next waiter. ``False`` (and no change) when the slot
        is not busy: released before, reclaimed, or never existed."""

    @abc.abstractmethod
    def withdraw(self, queue: str, task_id: str) -> bool:
        """Take waiter *task_id* out of line (revoked, timed out), cancelling its grant if
        it has one (the slot passes to the next waiter). ``False`` if it was not waiting."""

    @abc.abstractmethod
    def heartbeat(self, instance: str) -> None:
        """Keep *instance*'s slots alive for another ``instance_ttl``."""

    @abc.abstractmethod
    def restore(self, instance: str, config: QueueConfig,
                slots: Sequence[Slot] = ()) -> list[str]:
        """Re-assert the slots *instance* holds in queue ``config.name``, after the backend
        forgot them; the ids recorded busy again.

        For an instance that kept running while the backend lost track of it: the backend's
        state was lost (a Redis restarted without persistence), or the instance's lease
        lapsed while its tasks still ran. The first call after that (and the very first call)
        records each of *slots* the backend does not know as busy under *instance*, with its
        own slot id, task, key, label, acquisition time and max_hold expiry, even past the
        capacity: those tasks are running, so they count, and admissions wait until the
        queue is back under its cap. Skipped: a slot past its ``expires_at``, one whose id is
        busy or granted, one whose task holds a slot already, and one whose id does not name
        this queue. The slot sequence moves past every id passed, so no later slot takes one.
        It renews the instance's lease. Later calls renew the lease only (an operator's
        release or a max_hold reclaim is not undone) until the backend forgets the instance
        again (its lease lapsed, or its state was lost).

        A missing queue is created from *config* first, its slot sequence starting past the
        current time in microseconds (:func:`sequence_floor`), so ids granted after a loss
        never equal ids held from before it, whichever instance holds them (that would hold
        unless one queue granted over a million slots a second). An existing queue keeps its
        config and its sequence.
        """

    @abc.abstractmethod
    def reclaim(self) -> ReclaimReport:
        """Eagerly free what lapsed in every queue: slots of dead instances and past their
        max_hold, grants past ``grant_ttl``, waiters past ``waiter_ttl``."""

    # -- grants ---------------------------------------------------------------------------
    @abc.abstractmethod
    def pending_grants(self, queue: str | None = None) -> list[Grant]:
        """Grants not confirmed yet (so a poller can wake a waiter whose announcement it
        missed), oldest first."""

    @abc.abstractmethod
    def subscribe_grants(self, callback: GrantCallback) -> Subscription:
        """Call *callback(grant)* for every grant made from now on, by any process sharing
        the backend. Callbacks run outside any lock, possibly on another thread."""

    # -- operators ------------------------------------------------------------------------
    @abc.abstractmethod
    def stats(self, name: str) -> QueueStats:
        """Capacity, use, waiters, rate use and max hold of one queue."""

    @abc.abstractmethod
    def busy_slots(self, name: str) -> list[Slot]:
        """Held slots, oldest first."""

    @abc.abstractmethod
    def waiters(self, name: str, limit: int = 100) -> list[Waiter]:
        """Up to *limit* waiters, in the order they will be served."""

    @abc.abstractmethod
    def set_capacity(self, name: str, capacity: int | None) -> None:
        """Override the queue's capacity (``None`` resets to config). Stored in the backend,
        it wins over config until reset. Raising grants waiters at once; lowering takes no
        slot back."""

    @abc.abstractmethod
    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        """Override the queue's max_hold (``None`` resets); applies to slots granted after."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def on_event_loop(self, hub: Any) -> EventLoopCalls | None:
        """``try_admit`` and ``release`` answered on kombu's event loop *hub* (the worker's
        consumer loop) without waiting for the backend, or ``None`` (the default) if this
        backend answers at once anyway. Used by the worker's gate, on the hub's thread only."""
        return None

    # -- helpers shared by implementations -------------------------------------------------
    def release_many(self, slot_ids: Iterable[str]) -> int:
        """Release several slots; how many were busy."""
        return sum(1 for s in slot_ids if self.release(s))


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
    "AdmissionBackend", "Admitted", "Denied", "Decision", "Grant", "GrantCallback",
    "QueueStats", "ReclaimReport", "Slot", "Subscription", "Ticket", "Waiter",
    "RATE", "CONCURRENCY", "PER_KEY", "GRANT_BATCH", "KEY_SCAN", "queue_of_slot",
    "check_capacity_override", "check_max_hold_override", "restorable", "sequence_floor",
)
