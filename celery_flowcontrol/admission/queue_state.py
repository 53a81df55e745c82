"""One flow queue's admission state and its rules, in plain Python.

This is the reference model of the contract in :mod:`.base`: :class:`MemoryBackend` wraps
it in a lock, and the Redis backend's Lua scripts implement the same steps on Redis types
(the hypothesis test in ``tests/contract`` drives both with the same operations).

Waiters are kept in *lines*, one per group key (the ``fairness_key`` under ``fairness="key"``
or a per-key cap, else one shared line), each sorted by (priority desc, arrival). A *ring*
orders the lines by their head: (priority desc, virtual time, arrival), where the virtual
time of a key is bumped each time it is served, so the least recently served key comes
first. Every step is O(log n) in the number of waiters.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, replace

from sortedcontainers import SortedList

from ..config import QueueConfig
from .base import (
    CONCURRENCY,
    GRANT_BATCH,
    KEY_SCAN,
    PER_KEY,
    RATE,
    Admitted,
    Decision,
    Denied,
    Grant,
    ReclaimReport,
    Slot,
    Ticket,
    Waiter,
)
from .rate import RateWindow, make_window


@dataclass
class _Grant:
    grant: Grant
    waiter: Waiter
    expires_hold: float | None


class QueueState:
    """Slots, grants, waiters and rate window of one queue. Not thread-safe."""

    def __init__(self, config: QueueConfig, *, instance_ttl: float, grant_ttl: float,
                 waiter_ttl: float, emit: Callable[[Grant], None]) -> None:
        self.instance_ttl = instance_ttl
        self.grant_ttl = grant_ttl
        self.waiter_ttl = waiter_ttl
        self._emit = emit            # announce a grant (the backend defers it past its lock)
        # Instance leases are kept per queue (as the Redis backend must, one hash slot per
        # queue); a heartbeat renews an instance's lease in every queue.
        self.leases: dict[str, float] = {}
        self.lease_order: SortedList = SortedList()  # (expiry, instance)
        self.held: dict[str, set[str]] = {}           # instance -> slot ids
        self.asserted: set[str] = set()               # instances that restored (restore)
        self.capacity_override: int | None = None
        self.max_hold_override: float | None = None
        self.slots: dict[str, Slot] = {}
        self.slot_of_task: dict[str, str] = {}
        self.holds: SortedList = SortedList()        # (expires_at, slot_id)
        self.keycount: dict[str, int] = {}           # fairness_key -> slots + grants
        self.grants: dict[str, _Grant] = {}          # task_id -> grant
        self.grant_exp: SortedList = SortedList()    # (expires_at, task_id)
        self.waiting: dict[str, Waiter] = {}
        self.wexp: SortedList = SortedList()         # (expires_at, task_id)
        self.lines: dict[str, SortedList] = {}       # group key -> [(order, task_id)]
        self.ring: SortedList = SortedList()         # (-priority, vtime, order2, group key)
        self.ring_entry: dict[str, tuple] = {}
        self.vtime: dict[str, int] = {}
        self.vclock = 0
        self.seq = 0
        self.slot_seq = 0
        self.window: RateWindow | None = None
        self.config = config
        self.configure(config)

    # -- config -----------------------------------------------------------------------------
    def configure(self, config: QueueConfig) -> None:
        old = self.config
        self.config = config
        if self.window is None or old.rate_limit != config.rate_limit:
            self.window = make_window(config.rate_limit) if config.rate_limit else None
        if self.lines and (self._grouped(old) != self._grouped(config) or old.order != config.order
                           or old.fairness != config.fairness):
            self._rebuild_lines()

    @staticmethod
    def _grouped(config: QueueConfig) -> bool:
        return config.fairness == "key" or config.per_key_concurrency is not None

    @property
    def capacity(self) -> int | None:
        if self.capacity_override is not None:
            return self.capacity_override
        return self.config.concurrency

    @property
    def max_hold(self) -> float | None:
        if self.max_hold_override is not None:
            return self.max_hold_override
        return self.config.max_hold

    def free(self) -> float:
        cap = self.capacity
        return float("inf") if cap is None else cap - len(self.slots) - len(self.grants)

    # -- waiter lines ---------------------------------------------------------------------
    def _group(self, key: str) -> str:
        return key if self._grouped(self.config) else ""

    def _order(self, priority: int, seq: int) -> tuple[int, int]:
        return (-priority, -seq if self.config.order == "lifo" else seq)

    def _refresh_line(self, gk: str) -> None:
        old = self.ring_entry.pop(gk, None)
        if old is not None:
            self.ring.remove(old)
        line = self.lines.get(gk)
        if not line:
            self.lines.pop(gk, None)
            self.vtime.pop(gk, None)
            return
        (prio, order2), _ = line[0]
        vt = self.vtime.setdefault(gk, self.vclock) if self.config.fairness == "key" else 0
        entry = (prio, vt, order2, gk)
        self.ring_entry[gk] = entry
        self.ring.add(entry)

    def _rebuild_lines(self) -> None:
        self.lines.clear()
        self.ring.clear()
        self.ring_entry.clear()
        for w in self.waiting.values():
            self.lines.setdefault(self._group(w.fairness_key), SortedList()).add(
                (self._order(w.priority, w.seq), w.task_id))
        for gk in list(self.lines):
            self._refresh_line(gk)

    def _enqueue(self, w: Waiter) -> None:
        self.waiting[w.task_id] = w
        self.wexp.add((w.expires_at, w.task_id))
        gk = self._group(w.fairness_key)
        self.lines.setdefault(gk, SortedList()).add((self._order(w.priority, w.seq), w.task_id))
        self._refresh_line(gk)

    def _dequeue(self, task_id: str) -> Waiter | None:
        w = self.waiting.pop(task_id, None)
        if w is None:
            return None
        self.wexp.remove((w.expires_at, task_id))
        gk = self._group(w.fairness_key)
        self.lines[gk].remove((self._order(w.priority, w.seq), task_id))
        self._refresh_line(gk)
        return w

    def _served(self, key: str) -> None:
        """Bump *key*'s virtual time: it goes behind every key waiting since before."""
        if self.config.fairness == "key":
            self.vclock += 1
            gk = self._group(key)
            if gk in self.lines:
                self.vtime[gk] = self.vclock
                self._refresh_line(gk)

    def _saturated(self, key: str) -> bool:
        cap = self.config.per_key_concurrency
        return cap is not None and self.keycount.get(key, 0) >= cap

    def next_waiter(self) -> Waiter | None:
        """The rightful next waiter whose key is below its cap (scans KEY_SCAN lines)."""
        for entry in self.ring.islice(0, KEY_SCAN):
            w = self.waiting[self.lines[entry[3]][0][1]]
            if not self._saturated(w.fairness_key):
                return w
        return None

    def _beats(self, ticket: Ticket, head: Waiter) -> bool:
        """Would a ticket that is not waiting yet be served before waiter *head*?"""
        gk = self._group(ticket.fairness_key)
        mine = self._order(ticket.priority, self.seq + 1)
        line = self.lines.get(gk)
        if line and line[0][0] < mine:
            return False  # its own line's head goes first, and that is not before *head*
        vt = self.vtime.get(gk, self.vclock) if self.config.fairness == "key" else 0
        return (mine[0], vt, mine[1], gk) < self.ring_entry[self._group(head.fairness_key)]

    # -- slots ----------------------------------------------------------------------------
    def _new_slot_id(self) -> str:
        self.slot_seq += 1
        return f"{self.config.name}:{self.slot_seq}"

    def _hold_until(self, now: float) -> float | None:
        hold = self.max_hold
        return None if hold is None else now + hold

    def _add_slot(self, slot: Slot) -> None:
        self.slots[slot.slot_id] = slot
        self.slot_of_task[slot.task_id] = slot.slot_id
        if slot.expires_at is not None:
            self.holds.add((slot.expires_at, slot.slot_id))
        self.held.setdefault(slot.holder, set()).add(slot.slot_id)

    def drop_slot(self, slot_id: str) -> Slot | None:
        slot = self.slots.pop(slot_id, None)
        if slot is None:
            return None
        if self.slot_of_task.get(slot.task_id) == slot_id:
            del self.slot_of_task[slot.task_id]
        if slot.expires_at is not None:
            self.holds.remove((slot.expires_at, slot_id))
        self._uncount(slot.fairness_key)
        self._unhold(slot)
        return slot

    def _unhold(self, slot: Slot) -> None:
        held = self.held.get(slot.holder)
        if held is not None:
            held.discard(slot.slot_id)
            if not held:
                del self.held[slot.holder]

    # -- instance leases ------------------------------------------------------------------
    def lease(self, instance: str, now: float) -> None:
        old = self.leases.get(instance)
        if old is not None:
            self.lease_order.remove((old, instance))
        self.leases[instance] = now + self.instance_ttl
        self.lease_order.add((now + self.instance_ttl, instance))

    def lapse(self, now: float, limit: int | None = None) -> int:
        """Free the slots of instances whose lease ran out; grant them on.

        Slots of a ``release="manual"`` queue outlive their holder by design (a call placed
        by one worker ends in another): only release or ``max_hold`` frees them.
        """
        freed = 0
        manual = self.config.release == "manual"
        while self.lease_order and self.lease_order[0][0] <= now:
            _, instance = self.lease_order.pop(0)
            del self.leases[instance]
            for slot_id in [] if manual else list(self.held.get(instance, ())):
                self.drop_slot(slot_id)
                freed += 1
            if limit is not None and freed >= limit:
                break
        if freed:
            self.grant_pass(now)
        return freed

    def _count(self, key: str) -> None:
        self.keycount[key] = self.keycount.get(key, 0) + 1

    def _uncount(self, key: str) -> None:
        n = self.keycount.get(key, 0) - 1
        if n > 0:
            self.keycount[key] = n
        else:
            self.keycount.pop(key, None)

    def rehold(self, slot_id: str, holder: str) -> Slot:
        """A task that holds a slot is admitted again (its message redelivered, here or
        elsewhere): it keeps its slot, counted once, now held by *holder*. On an
        ``on_result`` queue the slot takes a fresh id: the earlier delivery may still release
        the old one (its result handled after the copy was admitted, as after a broker
        restart), which must not free the slot under the running copy. A manual slot keeps
        its id: user code may hold it."""
        slot = self.slots[slot_id]
        if self.config.release != "manual":
            self.drop_slot(slot_id)
            self._count(slot.fairness_key)
            slot = replace(slot, slot_id=self._new_slot_id(), holder=holder)
            self._add_slot(slot)
            return slot
        if slot.holder != holder:
            self._unhold(slot)
            slot = replace(slot, holder=holder)
            self.slots[slot_id] = slot
            self.held.setdefault(holder, set()).add(slot_id)
        return slot

    def restore(self, instance: str, slots: list[tuple[Slot, int]], now: float) -> list[str]:
        """Record what *instance* holds, once until this state forgets it (see
        :meth:`AdmissionBackend.restore`; *slots* come from :func:`.base.restorable`)."""
        # An instance is forgotten when its lease is gone or due (lapsed, or the state lost).
        for other in [i for i in self.asserted if self.leases.get(i, now) <= now]:
            self.asserted.discard(other)
        known = instance in self.asserted
        self.lease(instance, now)
        if known:
            return []
        self.asserted.add(instance)
        granted = {g.grant.slot_id for g in self.grants.values()}
        done = []
        for slot, n in slots:
            self.slot_seq = max(self.slot_seq, n)
            if (slot.slot_id in self.slots or slot.slot_id in granted
                    or slot.task_id in self.slot_of_task
                    or (slot.expires_at is not None and slot.expires_at <= now)):
                continue
            # Counted even past the capacity: the task runs, so admissions wait for it.
            self._count(slot.fairness_key)
            self._add_slot(replace(slot, holder=instance))
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
            w = self.next_waiter()
            if w is None:
                break
            self._grant(w, now)
            made += 1
        return made

    def _grant(self, w: Waiter, now: float) -> None:
        self._dequeue(w.task_id)
        self._served(w.fairness_key)
        grant = Grant(self.config.name, w.task_id, self._new_slot_id(), now, now + self.grant_ttl,
                      w.instance)
        self.grants[w.task_id] = _Grant(grant, w, self._hold_until(now))
        self.grant_exp.add((grant.expires_at, w.task_id))
        self._count(w.fairness_key)
        self._emit(grant)

    def _confirm(self, t: Ticket, now: float) -> Slot:
        """The waiter came back for its grant: the reserved slot becomes its slot."""
        if self.window is not None:
            self.window.consume(now)
        g = self._drop_grant(t.task_id)
        self._count(g.waiter.fairness_key)
        slot = Slot(g.grant.slot_id, self.config.name, t.instance, t.task_id,
                    g.waiter.fairness_key, t.label or g.waiter.label, now, g.expires_hold)
        self._add_slot(slot)
        return slot

    def _extend_grant(self, task_id: str, until: float) -> None:
        g = self.grants[task_id]
        if until > g.grant.expires_at:
            self.grant_exp.remove((g.grant.expires_at, task_id))
            g.grant = replace(g.grant, expires_at=until)
            self.grant_exp.add((until, task_id))

    def _drop_grant(self, task_id: str) -> _Grant:
        g = self.grants.pop(task_id)
        self.grant_exp.remove((g.grant.expires_at, task_id))
        self._uncount(g.waiter.fairness_key)
        return g

    # -- decisions ------------------------------------------------------------------------
    def admit(self, t: Ticket, now: float) -> Decision:
        """The whole decision for one ticket (see the contract in :mod:`.base`)."""
        held = self.slot_of_task.get(t.task_id)
        if held is not None:
            return Admitted(self.rehold(held, t.instance))
        retry_at = self.window.retry_at(now) if self.window is not None else None
        if t.task_id in self.grants:
            if retry_at is not None:
                # The slot stays reserved for it until the window lets it in.
                self._extend_grant(t.task_id, retry_at + self.grant_ttl)
                return Denied(retry_at, RATE)
            return Admitted(self._confirm(t, now))
        waiting = t.task_id in self.waiting
        if retry_at is not None:
            return self._deny(t, now, retry_at, RATE)
        # Serve the waiters better than this ticket first, one free slot each.
        free = self.free()
        competes = not self._saturated(t.fairness_key)
        head = self.next_waiter()
        grants = 0
        while (free > 0 and self.capacity is not None and head is not None
               and head.task_id != t.task_id):
            if grants >= GRANT_BATCH or (competes and not waiting and self._beats(t, head)):
                break
            self._grant(head, now)
            free -= 1
            grants += 1
            head = self.next_waiter()
        if free <= 0:
            return self._deny(t, now, now + self._backoff(), CONCURRENCY)
        if not competes:
            return self._deny(t, now, now + self._backoff(), PER_KEY)
        if waiting and self.capacity is not None and head is not None and head.task_id != t.task_id:
            return self._deny(t, now, now + self._backoff(), CONCURRENCY)
        if self.window is not None:
            self.window.consume(now)
        self._dequeue(t.task_id)
        self._served(t.fairness_key)
        self._count(t.fairness_key)
        slot = Slot(self._new_slot_id(), self.config.name, t.instance, t.task_id,
                    t.fairness_key, t.label, now, self._hold_until(now))
        self._add_slot(slot)
        return Admitted(slot)

    def _backoff(self) -> float:
        """How long a concurrency-blocked waiter waits before it re-checks by itself.

        Grants wake waiters at once; this re-check is a safety net. It grows with the line
        over the capacity, so the whole line re-checks at about ``capacity / retry`` per
        second however long it is, but stays under half of ``waiter_ttl`` so a waiter is
        never pruned while it waits its turn."""
        cap = max(self.capacity or 1, 1)
        ceiling = max(1, int(self.waiter_ttl / (2 * self.config.retry)))
        return self.config.retry * min(ceiling, 1 + len(self.waiting) // cap)

    def _deny(self, t: Ticket, now: float, retry_at: float, reason: str) -> Denied:
        old = self.waiting.get(t.task_id)
        expires_at = retry_at + self.waiter_ttl
        if old is not None:
            # A re-check keeps the waiter's place: same priority, key and seq, so the same
            # line entry. Updated in place, not dequeued and enqueued: emptying its line for
            # a moment would drop the key's virtual time and send it behind later keys.
            self.wexp.remove((old.expires_at, t.task_id))
            self.wexp.add((expires_at, t.task_id))
            self.waiting[t.task_id] = replace(old, label=t.label, instance=t.instance,
                                              expires_at=expires_at)
            return Denied(retry_at, reason)
        self.seq += 1
        self._enqueue(Waiter(self.config.name, t.task_id, t.priority, t.fairness_key, t.label,
                             self.seq, t.instance, now, expires_at))
        return Denied(retry_at, reason)

    def release(self, slot_id: str, now: float) -> bool:
        if self.drop_slot(slot_id) is None:
            return False
        self.grant_pass(now)
        return True

    def withdraw(self, task_id: str, now: float) -> bool:
        if task_id in self.grants:
            self._drop_grant(task_id)
            self.grant_pass(now)
            return True
        return self._dequeue(task_id) is not None

    def expire(self, now: float, limit: int | None = None) -> ReclaimReport:
        """Free slots of lapsed instances and past max_hold, pass on grants past grant_ttl,
        prune stale waiters."""
        lapsed = self.lapse(now, limit)
        held = 0
        while self.holds and self.holds[0][0] <= now and (limit is None or held < limit):
            self.drop_slot(self.holds[0][1])
            held += 1
        late: list[Waiter] = []
        while self.grant_exp and self.grant_exp[0][0] <= now and (limit is None or
                                                                  len(late) < limit):
            late.append(self._drop_grant(self.grant_exp[0][1]).waiter)
        pruned = 0
        while self.wexp and self.wexp[0][0] <= now and (limit is None or pruned < limit):
            self._dequeue(self.wexp[0][1])
            pruned += 1
        if held or late:
            self.grant_pass(now)
        if late:
            # The late waiters go back in line (their old place) only after the slots they
            # let lapse went to the next waiters.
            for w in late:
                self._enqueue(replace(w, expires_at=now + self.waiter_ttl))
            self.grant_pass(now)
        return ReclaimReport(lapsed, held, len(late), pruned)

    def idle(self) -> bool:
        """Nothing held, granted or waiting."""
        return not (self.slots or self.grants or self.waiting)

    # -- operator reads -------------------------------------------------------------------
    def ordered_waiters(self, limit: int) -> list[Waiter]:
        """Waiters in serving order: replays the ring as grants would walk it."""
        heap = list(self.ring)  # a sorted list is a valid heap
        pos: dict[str, int] = {}
        vclock = self.vclock
        out: list[Waiter] = []
        while heap and len(out) < limit:
            _, _, _, gk = heapq.heappop(heap)
            line = self.lines[gk]
            i = pos.get(gk, 0)
            out.append(self.waiting[line[i][1]])
            pos[gk] = i + 1
            if i + 1 < len(line):
                (prio, order2), _ = line[i + 1]
                vt = 0
                if self.config.fairness == "key":
                    vclock += 1
                    vt = vclock
                heapq.heappush(heap, (prio, vt, order2, gk))
        return out

    def rate_used(self, now: float) -> int:
        return 0 if self.window is None else self.window.used(now)
