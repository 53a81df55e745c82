"""The waiter lines of one flow queue: who waits, and in which order they are served.

Waiters are kept in *lines*, one per group key (the ``fairness_key`` where keys may differ,
:func:`.key_rules.grouped`, else one shared line), each sorted by (priority desc, arrival). A
*ring* orders the lines by their head: (priority desc, reserve, rank, arrival, key). *reserve*
is 0 for a key holding fewer slots than its reserve (it goes first), else 1. Under
``fairness="key"`` a line's *tag* is weighted fair queueing's virtual start time of its next
admission, and its *rank* that admission's midpoint, tag + 0.5 / weight (a Sainte-Lague
order): serving a key moves its tag on by the served cost / its weight, and the queue's
virtual time to the rank served; a key that starts waiting takes the later of the virtual time
and its own last tag (no credit for time away). This is start-time fair queueing on ranks, so
while keys stay backlogged two keys' admissions per unit of weight stay within one admission
of each other over any stretch. Ranks rather than start tags: where keys start waiting
together, start tags serve a whole round by arrival before a heavy key's second turn (it lags
its fluid share n * w / W by up to (N - 1) * w / W admissions, N keys of total weight W),
while ranks let each in as its weight says: off its fluid share by at most
1/2 + N * w / (2 * W), within one admission for any key of at most the mean weight.
Admissions while nobody waits move no tag. Every step is O(log n) in the number of waiters.
The Lua twin is in ``redis/lua/lines.lua`` (``enqueue``, ``dequeue_w``, ``take``,
``advance``, ``beats``, ...).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from ..config import QueueConfig
from .key_rules import KeyRules, grouped, resolve
from .values import KEY_SCAN, Ticket, Waiter

if TYPE_CHECKING:
    from .quota import Block


#: How many waiters, spread over those ahead of a waiter in its line, tell their cost (its turn).
TURN_SAMPLE = 8


class Lines:
    """The waiters of one queue, in the order they will be served. Not thread-safe.

    *rules* gives a key's weight and reserve, *held* how many slots (and grants) it holds,
    *grouping* whether lines are per key (each defaults to the config's alone)."""

    def __init__(self, config: QueueConfig, rules: Callable[[str], KeyRules] | None = None,
                 held: Callable[[str], int] | None = None,
                 grouping: Callable[[], bool] | None = None) -> None:
        self.config = config
        default = resolve(config, None, None)
        self.rules = rules or (lambda key: default)
        self.held = held or (lambda key: 0)
        self.grouping = grouping or (lambda: grouped(self.config))
        self.grouped = self.grouping()
        self.waiters: dict[str, Waiter] = {}
        self.expiry: SortedList = SortedList()       # (expires_at, task_id)
        self.by_group: dict[str, SortedList] = {}    # group key -> [(order, task_id)]
        self.ring: SortedList = SortedList()         # (-priority, reserve, rank, order2, gk)
        self.ring_entry: dict[str, tuple] = {}
        self.vtime: dict[str, float] = {}            # tag of each line, and of idle keys ahead
        self.idle: SortedList = SortedList()         # (tag, gk) of idle keys ahead of vclock
        self.vclock = 0.0                            # the virtual time (the last rank served)
        self.seq = 0                                 # arrivals so far

    def __len__(self) -> int:
        return len(self.waiters)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.waiters

    def configure(self, config: QueueConfig) -> None:
        """Take *config*: the lines are rebuilt if it regroups or reorders them, else rekeyed."""
        old, was = self.config, self.grouped
        self.config = config
        self.grouped = self.grouping()
        if was != self.grouped or old.order != config.order or old.fairness != config.fairness:
            if self.by_group:
                self._rebuild()
            return
        every = old.per_key_reserve != config.per_key_reserve  # else only keys= entries changed
        for gk in [k for k in self.ring_entry if every or old.keys.get(k) != config.keys.get(k)]:
            self._refresh(gk)

    # -- the lines and the ring -------------------------------------------------------------
    def _group(self, key: str) -> str:
        return key if self.grouped else ""

    def _fair(self) -> bool:
        return self.config.fairness == "key"

    def _reserve_flag(self, gk: str, extra: int = 0) -> int:
        """0 for a key holding fewer slots (plus *extra*) than its reserve, else 1."""
        if not self.grouped:
            return 1
        return 0 if self.held(gk) + extra < self.rules(gk).reserve else 1

    def _start(self, gk: str) -> float:
        """The tag a key that starts waiting takes: the later of the virtual time and its
        own last tag (kept while that is ahead of the virtual time)."""
        vt = self.vtime.get(gk)
        return self.vclock if vt is None or vt < self.vclock else vt

    def _rank(self, gk: str, tag: float) -> float:
        """A line's place among lines of one priority and reserve flag: the midpoint of its
        next unit of service, *tag* + 0.5 / weight (0 where keys are not weighed)."""
        return tag + 0.5 / self.rules(gk).weight if self._fair() else 0.0

    def _order(self, priority: int, seq: int) -> tuple[int, int]:
        return (-priority, -seq if self.config.order == "lifo" else seq)

    def _refresh(self, gk: str) -> None:
        old = self.ring_entry.pop(gk, None)
        if old is not None:
            self.ring.remove(old)
        line = self.by_group.get(gk)
        if not line:
            self.by_group.pop(gk, None)
            self._rest(gk)
            return
        (prio, order2), _ = line[0]
        vt = 0.0
        if self._fair():
            if old is None:  # a line that starts
                start = self._start(gk)
                self._unidle(gk)
                self.vtime[gk] = start
            vt = self.vtime[gk]
        entry = (prio, self._reserve_flag(gk), self._rank(gk, vt), order2, gk)
        self.ring_entry[gk] = entry
        self.ring.add(entry)

    def _rest(self, gk: str) -> None:
        """Line *gk* is empty: its tag is kept while it is ahead of the virtual time."""
        vt = self.vtime.get(gk)
        if vt is None:
            return
        if vt > self.vclock:
            self.idle.add((vt, gk))
        else:
            del self.vtime[gk]

    def _unidle(self, gk: str) -> None:
        vt = self.vtime.get(gk)
        if vt is not None:
            self.idle.discard((vt, gk))

    def recount(self, key: str) -> None:
        """*key*'s held slots changed: its line moves if that crosses its reserve."""
        gk = self._group(key)
        entry = self.ring_entry.get(gk)
        if entry is not None and entry[1] != self._reserve_flag(gk):
            self._refresh(gk)

    def rekey(self, key: str) -> None:
        """*key*'s weight or reserve may have changed: its waiting line is placed again from
        its tag, as a ring entry keeps the rank and reserve flag it was made with."""
        if self._group(key) in self.ring_entry:
            self._refresh(self._group(key))

    def _rebuild(self) -> None:
        self.by_group.clear()
        self.ring.clear()
        self.ring_entry.clear()
        self.vtime.clear()
        self.idle.clear()
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
        if block is not None and block.pace and (not block.keyed or self.grouped):
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

    def take(self, w: Waiter, cost: float) -> None:
        """Serve waiter *w* (a grant, or its own admission) at *cost*: out of line, its
        key's tag moved on."""
        gk = self._group(w.fairness_key)
        tag = self.vtime.get(gk, self.vclock) if self._fair() else 0.0
        self.remove(w.task_id)
        self._advance(gk, tag, cost)

    def admit_new(self, key: str, cost: float) -> None:
        """A ticket that was not waiting is admitted: while others wait its key's tag moves
        on as if it had waited (nobody waiting: no tag moves)."""
        if self.waiters and self._fair():
            gk = self._group(key)
            self._advance(gk, self.vtime[gk] if gk in self.by_group else self._start(gk), cost)

    def _advance(self, gk: str, tag: float, cost: float) -> None:
        if not self._fair():
            return
        rank = self._rank(gk, tag)
        if rank > self.vclock:
            self.vclock = rank
        finish = tag + cost / self.rules(gk).weight
        if gk in self.by_group:
            self.vtime[gk] = finish
            self._refresh(gk)
        else:
            self._unidle(gk)
            self.vtime[gk] = finish
            self._rest(gk)
        idle = self.idle
        while idle and idle[0][0] <= self.vclock:  # tags the virtual time passed are moot
            del self.vtime[idle.pop(0)[1]]

    # -- who is next ------------------------------------------------------------------------
    def next(self, skip: Callable[[Waiter], bool]) -> Waiter | None:
        """The rightful next waiter that is not to *skip* (scans KEY_SCAN lines)."""
        for entry in self.ring.islice(0, KEY_SCAN):
            w = self.waiters[self.by_group[entry[4]][0][1]]
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
        vt = 0.0
        if self._fair():
            vt = self.vtime[gk] if line else self._start(gk)
        entry = (mine[0], self._reserve_flag(gk), self._rank(gk, vt), mine[1], gk)
        return entry < self.ring_entry[self._group(head.fairness_key)]

    def waiting_of(self, key: str) -> int:
        """How many waiters *key* has (lines are per key wherever a key has a bound)."""
        return len(self.by_group.get(self._group(key), ()))

    def ordered(self, limit: int) -> list[Waiter]:
        """Up to *limit* waiters in serving order (:func:`replay`)."""
        return replay(self, limit)


def replay(lines: Lines, limit: int) -> list[Waiter]:
    """Up to *limit* waiters of *lines* in serving order: replays the ring as grants would
    walk it, each line's tag moved on as :meth:`Lines.take` would and ranked as it ranks."""
    heap = list(lines.ring)  # a sorted list is a valid heap
    pos: dict[str, int] = {}
    tags: dict[str, float] = {}
    out: list[Waiter] = []
    while heap and len(out) < limit:
        _, _, rank, _, gk = heapq.heappop(heap)
        line = lines.by_group[gk]
        i = pos.get(gk, 0)
        w = lines.waiters[line[i][1]]
        out.append(w)
        pos[gk] = i + 1
        if i + 1 < len(line):
            (prio, order2), _ = line[i + 1]
            if lines._fair():
                tags[gk] = tags.get(gk, lines.vtime[gk]) + w.cost / lines.rules(gk).weight
                rank = lines._rank(gk, tags[gk])
            heapq.heappush(heap, (prio, lines._reserve_flag(gk, i + 1), rank, order2, gk))
    return out
