"""In-process admission backend: the embedded default.

Features
    Every rule of the contract, exactly, for the processes of one Python interpreter (one
    worker instance): concurrency, fixed/sliding/GCRA rate limits (several at once, counted
    per call or per cost, queue-wide and per key, adaptive), backoffs, settled costs,
    priority, per-key fairness and caps, grants, max_hold, instance heartbeats, overrides.

Connection
    ``memory://`` (``flowcontrol_backend_url``). State lives in this object and dies with it;
    nothing is shared between worker nodes: use :class:`RedisBackend` for a fleet.

Options
    ``instance_ttl`` (30 s), ``grant_ttl`` (120 s), ``waiter_ttl`` (600 s), ``clock``
    (``time.time``; inject a fake one to test window maths exactly).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..config import KeyConfig, QueueConfig
from ..errors import FlowQueueFull, SettleError, UnknownQueueError
from .base import (
    LAZY_LIMIT,
    AdmissionBackend,
    Decision,
    Grant,
    GrantCallback,
    KeyStats,
    QueueStats,
    ReclaimReport,
    Slot,
    Subscription,
    Ticket,
    Waiter,
    check_capacity_override,
    check_max_hold_override,
    check_rate_override,
    queue_of_slot,
    restorable,
    sequence_floor,
)
from .queue_state import QueueState
from .quota import check_actual
from .release_rate import ReleaseRate

logger = logging.getLogger(__name__)


class _MemorySubscription(Subscription):
    def __init__(self, backend: MemoryBackend, callback: GrantCallback) -> None:
        self._backend = backend
        self.callback = callback

    def close(self) -> None:
        self._backend._unsubscribe(self)


class MemoryBackend(AdmissionBackend):
    """Admission state in this process, guarded by one lock."""

    def __init__(self, *, instance_ttl: float = 30.0, grant_ttl: float = 120.0,
                 waiter_ttl: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        self.instance_ttl = instance_ttl
        self.grant_ttl = grant_ttl
        self.waiter_ttl = waiter_ttl
        self.clock = clock
        self._lock = threading.RLock()
        self._queues: dict[str, QueueState] = {}
        self._releases: dict[str, ReleaseRate] = {}  # how fast each queue gives slots back
        self._subs: list[_MemorySubscription] = []
        self._outbox: list[Grant] = []

    # -- plumbing ---------------------------------------------------------------------------
    def _state(self, name: str) -> QueueState:
        try:
            return self._queues[name]
        except KeyError:
            raise UnknownQueueError(name) from None

    def _flush(self) -> None:
        """Announce grants made under the lock, outside it (callbacks may call back in)."""
        with self._lock:
            grants = self._outbox[:]  # QueueState holds a bound append: keep the list
            self._outbox.clear()
            subs = list(self._subs)
        for grant in grants:
            for sub in subs:
                try:
                    sub.callback(grant)
                except Exception:  # a subscriber's bug must not break admission
                    logger.exception("grant callback failed for %s", grant)

    def _maintain(self, now: float, limit: int | None,
                  queues: Collection[str] | None = None) -> ReclaimReport:
        report = ReclaimReport()
        for state in self._states(queues):
            report = report + state.expire(now, limit)
        return report

    def _states(self, queues: Collection[str] | None) -> list[QueueState]:
        """The states of *queues* that exist (``None``: every queue)."""
        if queues is None:
            return list(self._queues.values())
        return [s for s in (self._queues.get(n) for n in queues) if s is not None]

    # -- queues ---------------------------------------------------------------------------
    def register(self, config: QueueConfig) -> None:
        with self._lock:
            now = self.clock()
            state = self._queues.get(config.name)
            if state is None:
                self._queues[config.name] = QueueState(
                    config, instance_ttl=self.instance_ttl, grant_ttl=self.grant_ttl,
                    waiter_ttl=self.waiter_ttl, emit=self._outbox.append)
            else:
                state.configure(config)
                state.grant_pass(now)
        self._flush()

    def unregister(self, name: str, only_if_idle: bool = False) -> bool:
        with self._lock:
            state = self._queues.get(name)
            if state is None or (only_if_idle and not state.idle()):
                return False
            del self._queues[name]
            self._releases.pop(name, None)
            return True

    def queues(self) -> list[str]:
        with self._lock:
            return sorted(self._queues)

    def get_config(self, name: str) -> QueueConfig:
        with self._lock:
            return self._state(name).config

    # -- the hot path ---------------------------------------------------------------------
    def try_admit(self, ticket: Ticket) -> Decision:
        with self._lock:
            state = self._state(ticket.queue)
            state.quota.check_cost(ticket)  # before anything changes
            now = self.clock()
            state.expire(now, LAZY_LIMIT)
            state.busy.lease(ticket.instance, now)
            decision = state.admit(ticket, now)
        self._flush()
        return decision

    def release(self, slot_id: str) -> bool:
        queue = queue_of_slot(slot_id)
        with self._lock:
            state = self._queues.get(queue or "")
            now = self.clock()
            released = state is not None and state.release(slot_id, now)
            if released and queue:
                self._releases.setdefault(queue, ReleaseRate()).tick(now)
        self._flush()
        return released

    def release_rate(self, name: str) -> float:
        with self._lock:
            self._state(name)
            rate = self._releases.get(name)
            return 0.0 if rate is None else rate.value(self.clock())

    def settle(self, slot_id: str, actual: float) -> float:
        queue = queue_of_slot(slot_id)
        with self._lock:
            state = self._queues.get(queue or "")
            if state is None:
                check_actual(slot_id, actual)
                raise SettleError("is not busy: released, reclaimed, or never admitted",
                                  slot_id)
            delta = state.settle(slot_id, actual, self.clock())
        self._flush()
        return delta

    def backoff(self, queue: str, seconds: float, key: str | None = None) -> float:
        with self._lock:
            return self._state(queue).backoff(seconds, key, self.clock())

    def withdraw(self, queue: str, task_id: str) -> bool:
        with self._lock:
            done = self._state(queue).withdraw(task_id, self.clock())
        self._flush()
        return done

    def heartbeat(self, instance: str, queues: Collection[str] | None = None) -> None:
        with self._lock:
            now = self.clock()
            for state in self._states(queues):
                state.busy.lease(instance, now)

    def restore(self, instance: str, config: QueueConfig,
                slots: Sequence[Slot] = ()) -> list[str]:
        with self._lock:
            now = self.clock()
            state = self._queues.get(config.name)
            if state is None:
                state = self._queues[config.name] = QueueState(
                    config, instance_ttl=self.instance_ttl, grant_ttl=self.grant_ttl,
                    waiter_ttl=self.waiter_ttl, emit=self._outbox.append)
                state.slot_seq = sequence_floor(now)
            return state.restore(instance, restorable(config.name, slots), now)

    def reclaim(self, queues: Collection[str] | None = None) -> ReclaimReport:
        with self._lock:
            report = self._maintain(self.clock(), None, queues)
        self._flush()
        return report

    # -- grants ---------------------------------------------------------------------------
    def pending_grants(self, queue: str | None = None, *,
                       queues: Collection[str] | None = None) -> list[Grant]:
        with self._lock:
            states = [self._state(queue)] if queue else self._states(queues)
            grants = [g.grant for s in states for g in s.grants.values()]
        return sorted(grants, key=lambda g: (g.granted_at, g.slot_id))

    def subscribe_grants(self, callback: GrantCallback) -> Subscription:
        sub = _MemorySubscription(self, callback)
        with self._lock:
            self._subs.append(sub)
        return sub

    def _unsubscribe(self, sub: _MemorySubscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    # -- operators ------------------------------------------------------------------------
    def stats(self, name: str) -> QueueStats:
        with self._lock:
            s = self._state(name)
            now = self.clock()
            return QueueStats(
                name=name, capacity=s.capacity, concurrency=s.config.concurrency,
                capacity_override=s.capacity_override, in_use=len(s.busy),
                granted=len(s.grants), waiting=len(s.lines),
                rate_limit=s.quota.windows[0].rate if s.quota.windows else None,
                rate_used=s.rate_used(now), max_hold=s.max_hold,
                configured_max_hold=s.config.max_hold, max_hold_override=s.max_hold_override,
                rates=s.quota.uses(now), backoff_until=s.quota.backoff_until(now),
                rate_override=s.rate_override, paused_until=s.queue_paused(now),
                max_waiting=s.config.max_waiting, refused=s.refused)

    def busy_slots(self, name: str) -> list[Slot]:
        with self._lock:
            slots = list(self._state(name).busy.slots.values())
        return sorted(slots, key=lambda s: (s.acquired_at, int(s.slot_id.rpartition(":")[2])))

    def waiters(self, name: str, limit: int = 100) -> list[Waiter]:
        with self._lock:
            return self._state(name).ordered_waiters(limit)

    def set_capacity(self, name: str, capacity: int | None) -> None:
        with self._lock:
            state = self._state(name)
            state.capacity_override = check_capacity_override(name, capacity)
            state.grant_pass(self.clock())
        self._flush()

    def set_rate_limit(self, name: str, value: object) -> None:
        with self._lock:
            state = self._state(name)
            state.set_rate_override(check_rate_override(name, value))

    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        with self._lock:
            self._state(name).max_hold_override = check_max_hold_override(name, seconds)

    # -- unequal tenants ------------------------------------------------------------------
    def set_key(self, name: str, key: str, **fields: Any) -> KeyConfig:
        with self._lock:
            settings = self._state(name).set_key(key, fields, self.clock())
        self._flush()
        return settings

    def reset_key(self, name: str, key: str) -> None:
        with self._lock:
            self._state(name).reset_key(key, self.clock())
        self._flush()

    def pause(self, name: str, key: str | None = None, until: float | None = None) -> None:
        with self._lock:
            self._state(name).pause(key, until, self.clock())

    def resume(self, name: str, key: str | None = None) -> None:
        with self._lock:
            self._state(name).resume(key, self.clock())
        self._flush()

    def key_stats(self, name: str, limit: int = 20) -> list[KeyStats]:
        with self._lock:
            return self._state(name).key_stats(limit, self.clock())

    def waiting_bounded(self, name: str) -> bool:
        with self._lock:
            return self._state(name).keys.waiting_bounded()

    def would_refuse(self, name: str, key: str) -> FlowQueueFull | None:
        with self._lock:
            refused = self._state(name).refusal(key)
        return None if refused is None else refused.error()
