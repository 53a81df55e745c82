"""The admission contract: the :class:`AdmissionBackend` ABC (its value types: :mod:`.values`).

Every backend (in-process, Redis, or a user's own) keeps the same contract, stated once here
and proven by :func:`celery_flowcontrol.testing.run_admission_backend_contract`:

1. The rate limit is checked first and blocks every caller equally, whatever its priority.
   A blocked caller learns the exact instant the window allows the next admission.
2. Then concurrency: slots held plus slots granted stay below the capacity (the operator
   override when set, else the configured ``concurrency``; ``None`` means unlimited).
3. Waiters are served in order: higher ``priority`` first; then a key holding fewer slots
   than its ``reserve``; then, under ``fairness="key"``, the key whose turn it is by weight
   (weighted fair queueing: a key's tag moves on by cost / weight per admission, a key back
   from idle starts at the virtual time; equal weights take turns); then arrival order
   (``fifo`` or ``lifo``). Paused queues and keys take nothing: a grant a paused key would
   get passes to the next waiter not paused. A newcomer is admitted at once only if free
   slots outnumber the waiters better than it.
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
11. Every rate limit of a queue (``rate_limit``, one or a list), the ticket's key's windows
    (``per_key_rate_limit``) and every backoff in force are checked in the same atomic
    decision as concurrency; a denied caller gets the one instant at which all of them admit
    its cost (its reason :data:`KEY_RATE` when its key's window holds it longest, else
    :data:`RATE`), and a waiter behind others in its line its turn: one pace of the window that
    holds it longest (period x charge / limit) later per waiter ahead, times 0.9 (a turn
    errs early; a key's window counts only the key's own line). A ``per="cost"`` limit is
    charged the ticket's cost, a ``per="call"`` one 1; a cost above a ``per="cost"`` limit's
    capacity raises :class:`CostRefusedError` and changes nothing. A grant goes only to a
    waiter its key's windows and backoff let in now: a key held by its own limits keeps no
    slot from other keys.
12. A key's windows are forgotten once empty (bounded memory whatever the number of keys).
13. No starvation: once the oldest waiter held by the queue's rate limits has waited one
    period of the limit that held it, every other caller of a smaller cost waits until it
    is in (a caller of the same cost or more takes no room the oldest could use; an oldest
    its own key's limits hold back longer than the queue's keeps no room at all).
14. :meth:`AdmissionBackend.settle` corrects an admission's charge once; a refund wakes a
    waiter at once. :meth:`AdmissionBackend.backoff` pauses a queue (halving its adaptive
    limits) or a key; an adaptive limit regains a tenth of its ceiling per period.
15. A ticket that would start waiting while the queue has ``max_waiting`` waiters, or its
    key as many as its bound (``keys[k].max_waiting``, else ``per_key_max_waiting``), is
    :class:`Refused`: not put in line, holding nothing. A key's settings of its own
    (``keys=``, :meth:`AdmissionBackend.set_key`) replace the per-key defaults in the same
    atomic decision.

Times at this API are float seconds since the epoch, as returned by the backend's clock.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

from ..config import KeyConfig, QueueConfig
from ..errors import FlowControlError, FlowQueueFull

# The value types live in .values; they are named here too, where the worker and users'
# backends have always imported them from.
from .lines import grouped
from .values import (
    BACKOFF,
    CONCURRENCY,
    GRANT_BATCH,
    KEY_RATE,
    KEY_SCAN,
    LAZY_LIMIT,
    MAX_LABEL_BYTES,
    MAX_TASK_ID_BYTES,
    PAUSED,
    PER_KEY,
    RATE,
    Admitted,
    Decision,
    Denied,
    Grant,
    GrantCallback,
    KeyStats,
    Place,
    QueueStats,
    RateUse,
    ReclaimReport,
    Refused,
    Slot,
    Ticket,
    Waiter,
    check_capacity_override,
    check_max_hold_override,
    check_rate_override,
    queue_of_slot,
    restorable,
    sequence_floor,
)


class Subscription(abc.ABC):
    """A live grant subscription; :meth:`close` stops the callbacks."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop delivering grants. Idempotent."""



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

    def try_admit_many(self, tickets: Sequence[Ticket]) -> list[Decision]:
        """:meth:`try_admit` for each of *tickets*, in order: the same decisions as those calls
        one after another would make (a backend may make them in one round trip). An error
        :meth:`try_admit` would raise for a ticket is raised; the tickets after it may have
        been asked (asking again is idempotent by ticket)."""
        return [self.try_admit(t) for t in tickets]

    @abc.abstractmethod
    def release(self, slot_id: str) -> bool:
        """Free a slot; grant it to the next waiter. ``False`` (and no change) when the slot
        is not busy: released before, reclaimed, or never existed."""

    def settle(self, slot_id: str, actual: float) -> float:
        """Correct what the admission of busy slot *slot_id* charged to *actual*, in every
        ``per="cost"`` window that counted it, as if *actual* had been charged at admission
        (never below zero; a charge whose window is over stays as it was). A refund that frees
        room wakes a waiter at once: the oldest pending grant is announced again, or, in a
        queue without a concurrency cap, the next waiter is granted. Returns ``actual - cost``.

        Once per admission (a redelivered task keeps its admission's). :class:`SettleError`,
        with nothing changed, when *actual* is not a finite number >= 0, the slot is not busy,
        or it was settled already. Backends without quotas raise :class:`FlowControlError`.
        """
        raise FlowControlError(f"{type(self).__name__} does not support settle()")

    def backoff(self, queue: str, seconds: float, key: str | None = None) -> float:
        """Admit nothing of *queue* (or, with *key*, of that fairness key) until *seconds*
        from now, fleet-wide; the end of the backoff in force (a shorter one does not shorten
        a longer). A queue backoff that starts while none is in force halves each adaptive
        limit. Denials meanwhile carry :data:`BACKOFF`. :class:`FlowControlConfigError` for
        *seconds* outside ``(0, 86400]`` or a bad key."""
        raise FlowControlError(f"{type(self).__name__} does not support backoff()")

    @abc.abstractmethod
    def withdraw(self, queue: str, task_id: str) -> bool:
        """Take waiter *task_id* out of line (revoked, timed out), cancelling its grant if
        it has one (the slot passes to the next waiter). ``False`` if it was not waiting."""

    @abc.abstractmethod
    def heartbeat(self, instance: str, queues: Collection[str] | None = None) -> None:
        """Keep *instance*'s slots alive for another ``instance_ttl``: in *queues* (a worker
        passes the queues where it holds slots, so its heartbeat costs what it holds, not
        what is registered; unknown names are skipped), or in every queue (``None``). Its
        slots in a queue left out lapse there as if it had stopped."""

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
    def reclaim(self, queues: Collection[str] | None = None) -> ReclaimReport:
        """Eagerly free what lapsed in every queue (``None``: the beat task's pass), or in
        *queues* (a worker's pass over the queues where it holds slots or waits; unknown
        names are skipped): slots of dead instances and past their max_hold, grants past
        ``grant_ttl``, waiters past ``waiter_ttl``."""

    # -- grants ---------------------------------------------------------------------------
    @abc.abstractmethod
    def pending_grants(self, queue: str | None = None, *,
                       queues: Collection[str] | None = None) -> list[Grant]:
        """Grants not confirmed yet (so a poller can wake a waiter whose announcement it
        missed), oldest first: of *queue* (:class:`UnknownQueueError` if it is unknown), of
        *queues* (unknown names skipped), or of every queue."""

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

    def place(self, name: str, task_id: str) -> Place | None:
        """Where waiter *task_id* (a ticket id) stands in *name*'s line, in the order
        :meth:`waiters` lists (the order admission serves), or ``None`` if it is not waiting.
        This default lists the whole line once; a backend may answer without listing it."""
        line = self.waiters(name, self.stats(name).waiting + 1)
        mine = next((i for i, w in enumerate(line) if w.task_id == task_id), None)
        if mine is None:
            return None
        me, ahead = line[mine], line[:mine]
        turns = grouped(self.get_config(name))  # without lines per key, no turn is a key's
        return Place(mine + 1, sum(w.priority > me.priority for w in ahead),
                     sum(w.fairness_key != me.fairness_key for w in ahead) if turns else 0)

    def release_rate(self, name: str) -> float | None:
        """How many slots *name* gave back per second lately (a count of its releases that
        decays over :data:`~.release_rate.RELEASE_TAU` seconds, the newest weighing most;
        0.0 before the first), or ``None`` where the backend keeps no such count. Raises
        :class:`UnknownQueueError` for a queue it does not know."""
        self.get_config(name)
        return None

    @abc.abstractmethod
    def set_capacity(self, name: str, capacity: int | None) -> None:
        """Override the queue's capacity (``None`` resets to config). Stored in the backend,
        it wins over config until reset. Raising grants waiters at once; lowering takes no
        slot back."""

    def set_rate_limit(self, name: str, value: object) -> None:
        """Override the queue's rate limits with *value*, in every form ``rate_limit`` takes
        (one limit or a list; ``None`` resets to config). Stored in the backend, it wins over
        config until reset, a config registered meanwhile included; windows whose limits
        change start anew. :class:`FlowControlConfigError` (field ``rate_limit``) for a bad
        value. Backends without quotas raise :class:`FlowControlError`."""
        raise FlowControlError(f"{type(self).__name__} does not support set_rate_limit()")

    @abc.abstractmethod
    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        """Override the queue's max_hold (``None`` resets); applies to slots granted after."""

    # -- unequal tenants (docs/tenants.md) -------------------------------------------------
    def set_key(self, name: str, key: str, **fields: Any) -> KeyConfig:
        """Override fairness key *key*'s settings in queue *name*, fleet-wide, winning over
        ``keys=`` until :meth:`reset_key`. *fields* are :class:`KeyConfig`'s (``weight``,
        ``concurrency``, ``rate_limit``, ``reserve``, ``max_waiting``); one given as ``None``
        drops that field's override. Checked as ``keys=`` is (:class:`FlowControlConfigError`
        naming queue, key and field). Returns the key's effective settings. Backends without
        tenants raise :class:`FlowControlError`."""
        raise FlowControlError(f"{type(self).__name__} does not support set_key()")

    def reset_key(self, name: str, key: str) -> None:
        """Drop every run-time override of *key* in queue *name* (``keys=`` applies again)."""
        raise FlowControlError(f"{type(self).__name__} does not support reset_key()")

    def pause(self, name: str, key: str | None = None, until: float | None = None) -> None:
        """Admit nothing of queue *name* (or, with *key*, of that fairness key) until the
        epoch time *until* (``None``: until :meth:`resume`), fleet-wide. Running tasks keep
        their slots; waiters keep their places; a grant a paused key would get passes to the
        next waiter not paused. Denials meanwhile carry :data:`PAUSED`."""
        raise FlowControlError(f"{type(self).__name__} does not support pause()")

    def resume(self, name: str, key: str | None = None) -> None:
        """End a pause of queue *name* (or of *key*); waiters it held are granted at once."""
        raise FlowControlError(f"{type(self).__name__} does not support resume()")

    def key_stats(self, name: str, limit: int = 20) -> list[KeyStats]:
        """The busiest keys of queue *name* (by busy + waiting, most first), up to *limit*,
        and every key paused or overridden among them."""
        raise FlowControlError(f"{type(self).__name__} does not support key_stats()")

    def waiting_bounded(self, name: str) -> bool:
        """True if queue *name* has a waiting bound anywhere, as the backend holds it: its
        registered config's (``max_waiting``, ``per_key_max_waiting``, a key's in ``keys=``)
        or a key's run-time override (:meth:`set_key`). A producer asks :meth:`would_refuse`
        only where this is true, and caches it briefly (room.py), so it must be one cheap
        read. The default, ``True``, has producers ask :meth:`would_refuse` every time.

        :raises UnknownQueueError: for a queue nobody registered."""
        return True

    def would_refuse(self, name: str, key: str) -> FlowQueueFull | None:
        """The :class:`FlowQueueFull` a new call of *key* would meet in queue *name* now
        (its waiting bounds are full), else ``None``. Reads only."""
        return None

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


__all__: Sequence[str] = (
    "AdmissionBackend", "Admitted", "Denied", "Decision", "EventLoopCalls", "Grant",
    "GrantCallback", "KeyStats", "PAUSED", "QueueStats", "Refused", "RateUse", "ReclaimReport",
    "Slot", "Subscription", "Ticket",
    "Place", "Waiter", "RATE", "KEY_RATE", "CONCURRENCY", "PER_KEY", "BACKOFF", "GRANT_BATCH", "KEY_SCAN",
    "LAZY_LIMIT",
    "MAX_LABEL_BYTES", "MAX_TASK_ID_BYTES", "queue_of_slot",
    "check_capacity_override", "check_max_hold_override", "check_rate_override", "restorable",
    "sequence_floor",
)
