"""The busy slots of one flow queue, and the instance leases that keep them.

Each slot is found by its id, by the task it runs, by the instance that holds it and, when it
has a ``max_hold``, by the instant that runs out. An instance's lease is renewed by its
heartbeat and by every admission it asks for; when a lease runs out, the instance's slots are
free again (:meth:`BusySlots.lapse`). The Lua twin keeps the same indexes as Redis keys
(``redis/lua/busy.lua``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sortedcontainers import SortedList

from .quota import Charge
from .values import Slot


class BusySlots:
    """Busy slots by id, task, holder and max_hold expiry; per-key counts; leases.

    Not thread-safe. ``keycount`` counts a key's busy slots *and* its grants (the caller
    counts a grant when it makes one), so a per-key cap holds for both.
    """

    def __init__(self, instance_ttl: float) -> None:
        self.instance_ttl = instance_ttl
        self.slots: dict[str, Slot] = {}
        self.of_task: dict[str, str] = {}           # task id -> its slot id
        self.of_instance: dict[str, set[str]] = {}  # holder instance -> slot ids
        self.expiries: SortedList = SortedList()    # (max_hold expiry, slot id)
        self.keycount: dict[str, int] = {}          # fairness_key -> slots + grants
        self.charges: dict[str, Charge] = {}        # slot id -> what its admission charged
        # Instance leases are kept per queue (as the Redis backend must, one hash slot per
        # queue); a heartbeat renews an instance's lease in every queue.
        self.leases: dict[str, float] = {}
        self.lease_order: SortedList = SortedList()  # (expiry, instance)
        self.asserted: set[str] = set()              # instances that restored
        self.on_count: Callable[[str], None] | None = None  # told each key whose count moves

    def __len__(self) -> int:
        return len(self.slots)

    # -- slots ------------------------------------------------------------------------------
    def add(self, slot: Slot, charge: Charge | None = None) -> None:
        """Record *slot* busy, with what its admission charged (its key is counted by the
        caller)."""
        self.slots[slot.slot_id] = slot
        if charge is not None:
            self.charges[slot.slot_id] = charge
        self.of_task[slot.task_id] = slot.slot_id
        if slot.expires_at is not None:
            self.expiries.add((slot.expires_at, slot.slot_id))
        self.of_instance.setdefault(slot.holder, set()).add(slot.slot_id)

    def drop(self, slot_id: str) -> Slot | None:
        """Free slot *slot_id* (its key uncounted); ``None`` if it was not busy."""
        slot = self.slots.pop(slot_id, None)
        if slot is None:
            return None
        self.charges.pop(slot_id, None)
        if self.of_task.get(slot.task_id) == slot_id:
            del self.of_task[slot.task_id]
        if slot.expires_at is not None:
            self.expiries.remove((slot.expires_at, slot_id))
        self.uncount(slot.fairness_key)
        self._disown(slot)
        return slot

    def move(self, slot_id: str, holder: str) -> Slot:
        """Slot *slot_id*, held by *holder* from now on (same id)."""
        slot = self.slots[slot_id]
        if slot.holder != holder:
            self._disown(slot)
            slot = replace(slot, holder=holder)
            self.slots[slot_id] = slot
            self.of_instance.setdefault(holder, set()).add(slot_id)
        return slot

    def _disown(self, slot: Slot) -> None:
        ids = self.of_instance.get(slot.holder)
        if ids is not None:
            ids.discard(slot.slot_id)
            if not ids:
                del self.of_instance[slot.holder]

    # -- per-key counts ---------------------------------------------------------------------
    def count(self, key: str) -> None:
        self.keycount[key] = self.keycount.get(key, 0) + 1
        if self.on_count is not None:
            self.on_count(key)

    def uncount(self, key: str) -> None:
        n = self.keycount.get(key, 0) - 1
        if n > 0:
            self.keycount[key] = n
        else:
            self.keycount.pop(key, None)
        if self.on_count is not None:
            self.on_count(key)

    # -- instance leases --------------------------------------------------------------------
    def lease(self, instance: str, now: float) -> None:
        """Renew *instance*'s lease for ``instance_ttl`` from *now*."""
        old = self.leases.get(instance)
        if old is not None:
            self.lease_order.remove((old, instance))
        self.leases[instance] = now + self.instance_ttl
        self.lease_order.add((now + self.instance_ttl, instance))

    def lapse(self, now: float, limit: int | None, keep_slots: bool) -> int:
        """Forget the instances whose lease ran out by *now* and free their slots (unless
        *keep_slots*), stopping once *limit* slots were freed; how many were."""
        freed = 0
        while self.lease_order and self.lease_order[0][0] <= now:
            _, instance = self.lease_order.pop(0)
            del self.leases[instance]
            for slot_id in [] if keep_slots else list(self.of_instance.get(instance, ())):
                self.drop(slot_id)
                freed += 1
            if limit is not None and freed >= limit:
                break
        return freed

    # -- restore ----------------------------------------------------------------------------
    def first_restore(self, instance: str, now: float) -> bool:
        """Renew *instance*'s lease; True if it restores for the first time since this state
        last forgot it (its lease gone or due: lapsed, or the state lost)."""
        for other in [i for i in self.asserted if self.leases.get(i, now) <= now]:
            self.asserted.discard(other)
        known = instance in self.asserted
        self.lease(instance, now)
        if known:
            return False
        self.asserted.add(instance)
        return True

    def restore(self, slot: Slot, instance: str, now: float, granted: set[str]) -> bool:
        """Record *slot* busy under *instance*, unless its id is busy or in *granted*, its
        task holds a slot already, or its max_hold ran out; whether it was recorded."""
        if (slot.slot_id in self.slots or slot.slot_id in granted
                or slot.task_id in self.of_task
                or (slot.expires_at is not None and slot.expires_at <= now)):
            return False
        # Counted even past the capacity: the task runs, so admissions wait for it.
        self.count(slot.fairness_key)
        self.add(replace(slot, holder=instance))
        return True
