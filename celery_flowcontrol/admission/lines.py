"""The waiter lines of one flow queue: who waits, and in which order they are served.

Waiters are kept in *lines*, one per group key (the ``fairness_key`` under ``fairness="key"``
or a per-key cap, else one shared line), each sorted by (priority desc, arrival). A *ring*
orders the lines by their head: (priority desc, virtual time, arrival), where the virtual
time of a key is bumped each time it is served, so the least recently served key comes
first. Every step is O(log n) in the number of waiters. The Lua twin is in
``redis/lua/lines.lua`` (``enqueue``, ``dequeue_w``, ``served``, ``beats``, ...).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from ..config import QueueConfig
from .values import KEY_SCAN, Ticket, Waiter

if TYPE_CHECKING:
    from .quota import Block


#: How many waiters, spread over those ahead of a waiter in its line, tell their cost (its turn).
TURN_SAMPLE = 8


def grouped(config: QueueConfig) -> bool:
    """True if *config* keeps one line per ``fairness_key`` (else one shared line)."""
    return config.fairness == "key" or config.per_key_concurrency is not None


class Lines:
    """The waiters of one queue, in the order they will be served. Not thread-safe."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.waiters: dict[str, Waiter] = {}
        self.expiry: SortedList = SortedList()       # (expires_at, task_id)
        self.by_group: dict[str, SortedList] = {}    # group key -> [(order, task_id)]
        self.ring: SortedList = SortedList()         # (-priority, vtime, order2, group key)
        self.ring_entry: dict[str, tuple] = {}
        self.vtime: dict[str, int] = {}
        self.vclock = 0
        self.seq = 0                                 # arrivals so far

    def __len__(self) -> int:
        return len(self.waiters)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.waiters

    def configure(self, config: QueueConfig) -> None:
        """Take *config*; the lines are rebuilt if it changes how they are grouped or ordered."""
        old = self.config
        self.config = config
        if self.by_group and (grouped(old) != grouped(config) or old.order != config.order
                              or old.fairness != config.fairness):
            self._rebuild()

    # -- the lines and the ring -------------------------------------------------------------
    def _group(self, key: str) -> str:
        return key if grouped(self.config) else ""

    def _order(self, priority: int, seq: int) -> tuple[int, int]:
        return (-priority, -seq if self.config.order == "lifo" else seq)

    def _refresh(self, gk: str) -> None:
        old = self.ring_entry.pop(gk, None)
        if old is not None:
            self.ring.remove(old)
        line = self.by_group.get(gk)
        if not line:
            self.by_group.pop(gk, None)
            self.vtime.pop(gk, None)
            return
        (prio, order2), _ = line[0]
        vt = self.vtime.setdefault(gk, self.vclock) if self.config.fairness == "key" else 0
        entry = (prio, vt, order2, gk)
        self.ring_entry[gk] = entry
        self.ring.add(entry)

    def _rebuild(self) -> None:
        self.by_group.clear()
        self.ring.clear()
        self.ring_entry.clear()
        for w in self.waiters.values():
            self.by_group.setdefault(self._group(w.fairness_key), SortedList()).add(
                (self._order(w.priority, w.seq), w.task_id))
        for gk in list(self.by_group):
            self._refresh(gk)

    # -- waiters in and out -----------------------------------------------------------------
    def add(self, w: Waiter) -> None:
        """Put *w* in its line, at the place its priority and ``seq`` give it."""
        self.waiters[w.task_id] = w
        self.expiry.add((w.expires_at, w.task_id))
        gk = self._group(w.fairness_key)
        self.by_group.setdefault(gk, SortedList()).add(
            (self._order(w.priority, w.seq), w.task_id))
        self._refresh(gk)

    def remove(self, task_id: str) -> Waiter | None:
        """Take waiter *task_id* out of line; ``None`` if it was not waiting."""
        w = self.waiters.pop(task_id, None)
        if w is None:
            return None
        self.expiry.remove((w.expires_at, task_id))
        gk = self._group(w.fairness_key)
        self.by_group[gk].remove((self._order(w.priority, w.seq), task_id))
        self._refresh(gk)
        return w

    def wait(self, t: Ticket, now: float, expires_at: float) -> None:
        """*t* waits until *expires_at*: a newcomer joins the back of its line; a waiter
        re-checking keeps its place (same priority, key and seq, so the same line entry)."""
        old = self.waiters.get(t.task_id)
        if old is not None:
            # Updated in place, not removed and added: emptying its line for a moment would
            # drop the key's virtual time and send it behind later keys.
            self.expiry.remove((old.expires_at, t.task_id))
            self.expiry.add((expires_at, t.task_id))
            self.waiters[t.task_id] = replace(old, label=t.label, instance=t.instance,
                                              expires_at=expires_at)
            return
        self.seq += 1
        self.add(Waiter(self.config.name, t.task_id, t.priority, t.fairness_key, t.label,
                        self.seq, t.instance, now, expires_at, t.cost))

    def wait_turn(self, t: Ticket, now: float, retry_at: float, ttl: float,
                  block: Block | None) -> float:
        """:meth:`wait` for a ticket denied until *retry_at* (for *block*, if a rate limit's),
        kept *ttl* after; when it may come back: a rate block's turn, counting the waiters
        ahead of it in its line (a key window's only where the line is the key's)."""
        self.wait(t, now, retry_at + ttl)
        if block is not None and block.pace and (not block.keyed or grouped(self.config)):
            w = self.waiters[t.task_id]
            line = self.by_group[self._group(w.fairness_key)]
            ahead = line.index((self._order(w.priority, w.seq), t.task_id))
            mean = 1.0
            if block.per_cost and ahead:  # the cost of those ahead, from a few spread over them
                n = min(ahead, TURN_SAMPLE)
                seen = [self.waiters[line[(2 * j + 1) * ahead // (2 * n)][1]].cost for j in range(n)]
                mean = sum(seen) / n
            retry_at = block.turn(ahead, mean, now)
            self.wait(t, now, retry_at + ttl)
        return retry_at

    def served(self, key: str) -> None:
        """Bump *key*'s virtual time: it goes behind every key waiting since before."""
        if self.config.fairness == "key":
            self.vclock += 1
            gk = self._group(key)
            if gk in self.by_group:
                self.vtime[gk] = self.vclock
                self._refresh(gk)

    # -- who is next ------------------------------------------------------------------------
    def next(self, skip: Callable[[Waiter], bool]) -> Waiter | None:
        """The rightful next waiter that is not to *skip* (scans KEY_SCAN lines)."""
        for entry in self.ring.islice(0, KEY_SCAN):
            w = self.waiters[self.by_group[entry[3]][0][1]]
            if not skip(w):
                return w
        return None

    def beats(self, ticket: Ticket, head: Waiter) -> bool:
        """Would a ticket that is not waiting yet be served before waiter *head*?"""
        gk = self._group(ticket.fairness_key)
        mine = self._order(ticket.priority, self.seq + 1)
        line = self.by_group.get(gk)
        if line and line[0][0] < mine:
            return False  # its own line's head goes first, and that is not before *head*
        vt = self.vtime.get(gk, self.vclock) if self.config.fairness == "key" else 0
        return (mine[0], vt, mine[1], gk) < self.ring_entry[self._group(head.fairness_key)]

    def ordered(self, limit: int) -> list[Waiter]:
        """Up to *limit* waiters in serving order: replays the ring as grants would walk it."""
        heap = list(self.ring)  # a sorted list is a valid heap
        pos: dict[str, int] = {}
        vclock = self.vclock
        out: list[Waiter] = []
        while heap and len(out) < limit:
            _, _, _, gk = heapq.heappop(heap)
            line = self.by_group[gk]
            i = pos.get(gk, 0)
            out.append(self.waiters[line[i][1]])
            pos[gk] = i + 1
            if i + 1 < len(line):
                (prio, order2), _ = line[i + 1]
                vt = 0
                if self.config.fairness == "key":
                    vclock += 1
                    vt = vclock
                heapq.heappush(heap, (prio, vt, order2, gk))
        return out
