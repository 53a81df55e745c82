"""One flow queue's admission state and its rules, in plain Python.

This is the reference model of the contract in :mod:`.base`: :class:`MemoryBackend` wraps
it in a lock, and the Redis backend's Lua scripts implement the same steps on Redis types
(the hypothesis test in ``tests/contract`` drives both with the same operations).

The state is in four parts: the busy slots and instance leases (:mod:`.busy`), the waiter
lines (:mod:`.lines`), the rate limits, per-key windows and backoffs (:mod:`.quota`) and,
here, the grants and the overrides, with the rules that move slots between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from sortedcontainers import SortedList

from ..config import QueueConfig, RateLimit
from .busy import BusySlots
from .quota import Block, Quota
from .settling import QuotaSteps
from .tenant_steps import TenantSteps
from .values import (
    CONCURRENCY,
    GRANT_BATCH,
    PAUSED,
    PER_KEY,
    Admitted,
    Decision,
    Denied,
    Grant,
    ReclaimReport,
    Refused,
    Slot,
    Ticket,
    Waiter,
)


@dataclass
class _Grant:
    grant: Grant
    waiter: Waiter
    slot_expires_at: float | None  # the slot's max_hold expiry, fixed when granted


class Grants:
    """Freed slots reserved for waiters, by the waiter's task id and by expiry."""

    def __init__(self) -> None:
        self.by_task: dict[str, _Grant] = {}
        self.expiry: SortedList = SortedList()    # (expires_at, task_id)

    def __len__(self) -> int:
        return len(self.by_task)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.by_task

    def values(self) -> Iterable[_Grant]:
        return self.by_task.values()

    def add(self, g: _Grant) -> None:
        self.by_task[g.grant.task_id] = g
        self.expiry.add((g.grant.expires_at, g.grant.task_id))

    def drop(self, task_id: str) -> _Grant:
        g = self.by_task.pop(task_id)
        self.expiry.remove((g.grant.expires_at, task_id))
        return g

    def extend(self, task_id: str, until: float) -> None:
        """Keep *task_id*'s grant until *until* at least."""
        g = self.by_task[task_id]
        if until > g.grant.expires_at:
            self.expiry.remove((g.grant.expires_at, task_id))
            g.grant = replace(g.grant, expires_at=until)
            self.expiry.add((until, task_id))


class QueueState(TenantSteps, QuotaSteps):
    """Slots, grants, waiters and rate limits of one queue. Not thread-safe."""

    def __init__(self, config: QueueConfig, *, instance_ttl: float, grant_ttl: float,
                 waiter_ttl: float, emit: Callable[[Grant], None]) -> None:
        self.instance_ttl = instance_ttl
        self.grant_ttl = grant_ttl
        self.waiter_ttl = waiter_ttl
        self._emit = emit            # announce a grant (the backend defers it past its lock)
        self.busy = BusySlots(instance_ttl)
        self.start_tenants(config)
        self.capacity_override: int | None = None
        self.max_hold_override: float | None = None
        self.rate_override: tuple[RateLimit, ...] | None = None
        self.grants = Grants()
        self.slot_seq = 0
        self.quota = Quota(config, grant_ttl, lambda key: self.keys.of(key).rates)
        self.config = config
        self.configure(config)

    # -- config -----------------------------------------------------------------------------
    def configure(self, config: QueueConfig) -> None:
        self.config = config
        self.keys.configure(config)
        self.quota.configure(self.effective(config))
        self.lines.configure(config)

    @property
    def capacity(self) -> int | None:
        override = self.capacity_override
        return self.config.concurrency if override is None else override

    @property
    def max_hold(self) -> float | None:
        override = self.max_hold_override
        return self.config.max_hold if override is None else override

    def free(self) -> float:
        cap = self.capacity
        return float("inf") if cap is None else cap - len(self.busy.slots) - len(self.grants.by_task)

    # -- slots ----------------------------------------------------------------------------
    def _new_slot_id(self) -> str:
        self.slot_seq += 1
        return f"{self.config.name}:{self.slot_seq}"

    def _max_hold_until(self, now: float) -> float | None:
        seconds = self.max_hold
        return None if seconds is None else now + seconds

    def readmit(self, slot_id: str, holder: str) -> Slot:
        """A task that holds a slot is admitted again (its message redelivered, here or
        elsewhere): it keeps its slot, counted once, now held by *holder*. On an
        ``on_result`` queue the slot takes a fresh id: the earlier delivery may still release
        the old one (its result handled after the copy was admitted, as after a broker
        restart), which must not free the slot under the running copy. A manual slot keeps
        its id: user code may hold it."""
        if self.config.release == "manual":
            return self.busy.move(slot_id, holder)
        charge = self.busy.charges.get(slot_id)
        slot = self.busy.drop(slot_id)
        assert slot is not None
        self.busy.count(slot.fairness_key)
        slot = replace(slot, slot_id=self._new_slot_id(), holder=holder)
        self.busy.add(slot, charge)
        return slot

    def restore(self, instance: str, slots: list[tuple[Slot, int]], now: float) -> list[str]:
        """Record what *instance* holds, once until this state forgets it (see
        :meth:`AdmissionBackend.restore`; *slots* come from :func:`.values.restorable`)."""
        if not self.busy.first_restore(instance, now):
            return []
        granted = {g.grant.slot_id for g in self.grants.values()}
        done = []
        for slot, n in slots:
            self.slot_seq = max(self.slot_seq, n)
            if self.busy.restore(slot, instance, now, granted):
                done.append(slot.slot_id)
        return done

    # -- grants ---------------------------------------------------------------------------
    def grant_pass(self, now: float, limit: int = GRANT_BATCH) -> int:
        """Grant free slots to the rightful next waiters.

        A grant reserves concurrency only; the rate limit is taken when the waiter confirms,
        so it governs the instants tasks are really admitted (a grant's wake-up takes a
        variable while). A queue without a concurrency cap has nothing to reserve.
        """
        made = 0
        if self.capacity is None:
            return 0
        while made < limit and self.free() > 0:
            w = self.next_waiter(now)
            if w is None:
                break
            self._grant(w, now)
            made += 1
        return made

    def _grant(self, w: Waiter, now: float) -> None:
        self.lines.take(w, w.cost)
        grant = Grant(self.config.name, w.task_id, self._new_slot_id(), now, now + self.grant_ttl,
                      w.instance)
        self.grants.add(_Grant(grant, w, self._max_hold_until(now)))
        self.busy.count(w.fairness_key)
        self._emit(grant)

    def _confirm(self, t: Ticket, now: float) -> Slot:
        """The waiter came back for its grant: the reserved slot becomes its slot (its cost is
        charged now, to the waiter's key)."""
        g = self._drop_grant(t.task_id)
        charge = self.quota.consume(replace(t, fairness_key=g.waiter.fairness_key), now)
        self.busy.count(g.waiter.fairness_key)
        self.admitted_now(g.waiter.fairness_key, now)
        slot = Slot(g.grant.slot_id, self.config.name, t.instance, t.task_id,
                    g.waiter.fairness_key, t.label or g.waiter.label, now, g.slot_expires_at)
        self.busy.add(slot, charge)
        return slot

    def _drop_grant(self, task_id: str) -> _Grant:
        g = self.grants.drop(task_id)
        self.busy.uncount(g.waiter.fairness_key)
        return g

    # -- decisions ------------------------------------------------------------------------
    def admit(self, t: Ticket, now: float) -> Decision:
        """The whole decision for one ticket (:mod:`.base`'s contract), its cost checked first."""
        busy = self.busy.of_task.get(t.task_id)
        if busy is not None:
            return Admitted(self.readmit(busy, t.instance))
        granted = self.grants.by_task.get(t.task_id)
        pause = self.pause_of(granted.waiter.fairness_key if granted else t.fairness_key, now)
        if pause is not None:
            self.pass_grant(granted, now)
            return self._deny(t, now, pause, PAUSED)
        if granted is not None:
            # Its limits are its waiter's: the key it first asked with (what its cost may be too).
            self.quota.check_cost(replace(t, fairness_key=granted.waiter.fairness_key))
            block = self.quota.check(replace(t, fairness_key=granted.waiter.fairness_key), now)
            if block is not None:
                # The slot stays reserved for it until the window lets it in.
                self.grants.extend(t.task_id, block.retry_at + self.grant_ttl)
                self.quota.blocked(t.task_id, granted.waiter.since, t.cost, block)
                return Denied(block.retry_at, block.reason)
            return Admitted(self._confirm(t, now))
        waiting = t.task_id in self.lines.waiters
        block = self.quota.check(t, now)
        if block is not None:
            return self._deny(t, now, block.retry_at, block.reason, block)
        # Serve the waiters better than this ticket first, one free slot each.
        free = self.free()
        competes = not self._saturated(t.fairness_key)
        head = self.next_waiter(now)
        grants = 0
        while (free > 0 and self.capacity is not None and head is not None
               and head.task_id != t.task_id):
            if grants >= GRANT_BATCH or (competes and not waiting and self.lines.beats(t, head)):
                break
            self._grant(head, now)
            free -= 1
            grants += 1
            head = self.next_waiter(now)
        if free <= 0:
            return self._deny(t, now, self._recheck_at(now), CONCURRENCY)
        if not competes:
            return self._deny(t, now, self._recheck_at(now), PER_KEY)
        if waiting and self.capacity is not None and head is not None and head.task_id != t.task_id:
            return self._deny(t, now, self._recheck_at(now), CONCURRENCY)
        charge = self.quota.consume(t, now)
        if waiting:
            self.lines.take(self.lines.waiters[t.task_id], t.cost)
        else:
            self.lines.admit_new(t.fairness_key, t.cost)
        self.busy.count(t.fairness_key)
        self.admitted_now(t.fairness_key, now)
        slot = Slot(self._new_slot_id(), self.config.name, t.instance, t.task_id,
                    t.fairness_key, t.label, now, self._max_hold_until(now))
        self.busy.add(slot, charge)
        return Admitted(slot)

    def _recheck_at(self, now: float) -> float:
        return now + recheck_after(self.config.retry, self.waiter_ttl, self.capacity,
                                   len(self.lines.waiters))

    def _deny(self, t: Ticket, now: float, retry_at: float, reason: str,
              block: Block | None = None) -> Denied | Refused:
        refused = None if t.task_id in self.lines.waiters else self.refuse(t.fairness_key)
        if refused is not None:
            return refused
        retry_at = self.lines.wait_turn(t, now, retry_at, self.waiter_ttl, block)
        self.quota.blocked(t.task_id, self.lines.waiters[t.task_id].since, t.cost, block)
        return Denied(retry_at, reason)

    def release(self, slot_id: str, now: float) -> bool:
        if self.busy.drop(slot_id) is None:
            return False
        self.grant_pass(now)
        return True

    def withdraw(self, task_id: str, now: float) -> bool:
        self.quota.unline(task_id)
        if task_id in self.grants.by_task:
            self._drop_grant(task_id)
            self.grant_pass(now)
            return True
        return self.lines.remove(task_id) is not None

    def expire(self, now: float, limit: int | None = None) -> ReclaimReport:
        """Free slots of lapsed instances and past max_hold, pass on grants past grant_ttl,
        prune stale waiters."""
        # Slots of a ``release="manual"`` queue outlive their holder by design (a call placed
        # by one worker ends in another): only release or max_hold frees them.
        lapsed = self.busy.lapse(now, limit, keep_slots=self.config.release == "manual")
        if lapsed:
            self.grant_pass(now)
        # Each index is sorted by expiry: its first entry says whether anything is due.
        overdue = 0
        expiries = self.busy.expiries
        while expiries and expiries[0][0] <= now and (limit is None or overdue < limit):
            self.busy.drop(expiries[0][1])
            overdue += 1
        late: list[Waiter] = []
        granted = self.grants.expiry
        while granted and granted[0][0] <= now and (limit is None or len(late) < limit):
            late.append(self._drop_grant(granted[0][1]).waiter)
        pruned = 0
        waiting = self.lines.expiry
        while waiting and waiting[0][0] <= now and (limit is None or pruned < limit):
            self.quota.unline(waiting[0][1])
            self.lines.remove(waiting[0][1])
            pruned += 1
        self.quota.prune(now, limit)
        if overdue or late:
            self.grant_pass(now)
        if late:
            # The late waiters go back in line (their old place) only after the slots they
            # let lapse went to the next waiters.
            for w in late:
                self.lines.add(replace(w, expires_at=now + self.waiter_ttl))
            self.grant_pass(now)
        return ReclaimReport(lapsed, overdue, len(late), pruned)

    def idle(self) -> bool:
        """Nothing busy, granted or waiting."""
        return not (self.busy.slots or self.grants.by_task or self.lines.waiters)

    # -- operator reads -------------------------------------------------------------------
    def ordered_waiters(self, limit: int) -> list[Waiter]:
        """Waiters in serving order."""
        return self.lines.ordered(limit)


def recheck_after(retry: float, waiter_ttl: float, capacity: int | None, waiting: int) -> float:
    """How long a concurrency-blocked waiter waits before it re-checks by itself.

    Grants wake waiters at once; this re-check is a safety net. It grows with the line
    over the capacity, so the whole line re-checks at about ``capacity / retry`` per
    second however long it is, but stays under half of ``waiter_ttl`` so a waiter is
    never pruned while it waits its turn. (The Lua twin: ``recheck_at`` in queue_state.lua.)"""
    cap = max(capacity or 1, 1)
    ceiling = max(1, int(waiter_ttl / (2 * retry)))
    return retry * min(ceiling, 1 + waiting // cap)
