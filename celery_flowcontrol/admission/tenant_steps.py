"""The tenant steps of one flow queue's state: per-key settings at run time, pauses, bounded
waiting, and what an operator reads of the keys.

A mixin of :class:`~.queue_state.QueueState` (kept apart so each part stays one idea), in
the terms of the state's busy slots, lines, quota and key table. The Lua twins are
``set_key.lua``, ``pause.lua``, ``key_stats.lua`` and the refusal and pause checks of
``queue_state.lua``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..config import KeyConfig, QueueConfig
from ..config.key_config import check_key
from ..errors import FlowControlConfigError
from .busy import BusySlots
from .key_rules import KeyRules, KeyTable
from .lines import Lines
from .quota import Quota
from .values import GRANT_BATCH, KeyStats, Refused, Waiter

#: Admissions are counted per key in buckets of this many seconds; ``admitted_recent`` is
#: the sum of the current bucket and the one before (the last 30 to 60 s).
RECENT_BUCKET = 30.0
#: How long a bucket is kept in Redis (two buckets and a margin).
RECENT_TTL_MS = 90_000


def check_until(queue: str, until: object) -> float:
    """A pause's end: epoch seconds (a finite number), or ``None`` for no end (inf)."""
    if until is None:
        return math.inf
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
        raise FlowControlConfigError(
            f"must be None or a time in epoch seconds, got {until!r}", queue, "until")
    return float(until)


def key_row(key: str, rules: KeyRules, busy: int, waiting: int, paused_until: float | None,
            admitted: int) -> KeyStats:
    """One row of :meth:`AdmissionBackend.key_stats`."""
    return KeyStats(key, busy, waiting, rules.weight, rules.concurrency, rules.rates or None,
                    rules.reserve, rules.max_waiting, paused_until, admitted, rules.own)


class TenantSteps:
    """Key settings, pauses, refusals and key reads, for :class:`~.queue_state.QueueState`."""

    config: QueueConfig
    keys: KeyTable
    lines: Lines
    busy: BusySlots
    quota: Quota
    paused_until: float | None
    key_paused: dict[str, float]
    refused: int
    recent: dict[int, Counter[str]]  # admissions per key, by RECENT_BUCKET

    def grant_pass(self, now: float, limit: int = GRANT_BATCH) -> int:
        raise NotImplementedError

    def _drop_grant(self, task_id: str) -> Any:
        raise NotImplementedError

    waiter_ttl: float

    def start_tenants(self, config: QueueConfig) -> None:
        self.keys = KeyTable(config)
        self.lines = Lines(config, self.keys.of, lambda key: self.busy.keycount.get(key, 0),
                           self.keys.grouped)
        self.busy.on_count = self.lines.recount
        self.paused_until = None       # an operator's pause of the queue
        self.key_paused = {}           # and of single keys (inf: until resumed)
        self.refused = 0
        self.recent = {}

    def _recheck_at(self, now: float) -> float:
        raise NotImplementedError

    def _saturated(self, key: str) -> bool:
        cap = self.keys.of(key).concurrency
        return cap is not None and self.busy.keycount.get(key, 0) >= cap

    def next_waiter(self, now: float) -> Waiter | None:
        """The rightful next waiter its key's cap, rate windows, backoff and pause let in
        (none while the queue is paused)."""
        if self.queue_paused(now) is not None:
            return None
        return self.lines.next(lambda w: self._saturated(w.fairness_key)
                               or self.key_pause(w.fairness_key, now) is not None
                               or self.quota.key_holds(w.fairness_key, w.cost, now))

    # -- settings ---------------------------------------------------------------------------
    def set_key(self, key: object, changes: Mapping[str, Any], now: float) -> KeyConfig:
        key = check_key(self.config.name, key)
        before = self.keys.of(key)
        settings = self.keys.set(key, changes)
        self._rekeyed(key, before, now)
        return settings

    def reset_key(self, key: object, now: float) -> None:
        key = check_key(self.config.name, key)
        before = self.keys.of(key)
        self.keys.reset(key)
        self._rekeyed(key, before, now)

    def _rekeyed(self, key: str, before: Any, now: float) -> None:
        """*key*'s rules changed from *before*: lines regroup if that changes their grouping,
        its windows restart if its limits changed, its line moves if its weight or reserve
        did, and a cap raised grants at once."""
        after = self.keys.of(key)
        self.lines.configure(self.config)
        if after.rates != before.rates:
            self.quota.refit(key)
        self.lines.rekey(key)
        self.grant_pass(now)

    # -- pauses -----------------------------------------------------------------------------
    def pause(self, key: str | None, until: object, now: float) -> None:
        end = check_until(self.config.name, until)
        if key is None:
            self.paused_until = end
        else:
            self.key_paused[check_key(self.config.name, key)] = end

    def resume(self, key: str | None, now: float) -> None:
        """End the pause (and a backoff) of the queue or of *key*; its waiters are granted."""
        if key is None:
            self.paused_until = None
            self.quota.until = None
        else:
            key = check_key(self.config.name, key)
            self.key_paused.pop(key, None)
            ks = self.quota.keys.get(key)
            if ks is not None and ks.until is not None:
                ks.until = None
                self.quota._track(key, ks)
        self.grant_pass(now)

    def queue_paused(self, now: float) -> float | None:
        """The end of the operator's pause of the queue in force (inf: none), or ``None``."""
        until = self.paused_until
        return until if until is not None and until > now else None

    def key_pause(self, key: str, now: float) -> float | None:
        if not self.key_paused:
            return None
        until = self.key_paused.get(key)
        if until is None:
            return None
        if until <= now:
            del self.key_paused[key]
            return None
        return until

    def pause_of(self, key: str, now: float) -> float | None:
        """When a ticket of *key* paused now may come back (a pause without end: at its
        next re-check), or ``None`` if no pause holds it."""
        ends = [u for u in (self.queue_paused(now), self.key_pause(key, now)) if u is not None]
        if not ends:
            return None
        until = max(ends)
        return self._recheck_at(now) if until == math.inf else until

    def pass_grant(self, granted: Any, now: float) -> None:
        """A paused key's grant (if *granted*) passes to the next waiter not paused; its
        waiter waits again, in its old place."""
        if granted is not None:
            self._drop_grant(granted.grant.task_id)
            self.lines.add(replace(granted.waiter, expires_at=now + self.waiter_ttl))
            self.grant_pass(now)

    # -- bounded waiting --------------------------------------------------------------------
    def refuse(self, key: str) -> Refused | None:
        """:meth:`refusal`, counted."""
        refused = self.refusal(key)
        if refused is not None:
            self.refused += 1
        return refused

    def refusal(self, key: str) -> Refused | None:
        """The refusal a ticket of *key* meets that would start waiting now, or ``None``."""
        bound = self.config.max_waiting
        if bound is not None and len(self.lines) >= bound:
            return Refused(self.config.name, key, bound, "max_waiting")
        rules = self.keys.of(key)
        if rules.max_waiting is not None and self.lines.waiting_of(key) >= rules.max_waiting:
            return Refused(self.config.name, key, rules.max_waiting, rules.bound_field)
        return None

    # -- reads ------------------------------------------------------------------------------
    def admitted_now(self, key: str, now: float) -> None:
        """Count one admission of *key* (in :data:`RECENT_BUCKET` buckets)."""
        if self.config.fairness != "key":
            return
        bucket = math.floor(now / RECENT_BUCKET)
        recent = self.recent
        recent.setdefault(bucket, Counter())[key] += 1
        for old in [b for b in recent if b < bucket - 1]:
            del recent[old]

    def key_stats(self, limit: int, now: float) -> list[KeyStats]:
        recent = self.recent
        bucket = math.floor(now / RECENT_BUCKET)
        admitted = recent.get(bucket, Counter()) + recent.get(bucket - 1, Counter())
        waiting: Counter[str] = Counter(w.fairness_key for w in self.lines.waiters.values())
        keys = (set(self.busy.keycount) | set(waiting) | set(self.config.keys)
                | set(self.keys.overrides) | set(self.key_paused) | set(self.quota.keys))
        rows = []
        for key in keys:
            rules = self.keys.of(key)
            pause = self.key_pause(key, now)
            ks = self.quota.keys.get(key)
            backoff = ks.until if ks is not None and ks.until is not None and ks.until > now else None
            ends = [u for u in (pause, backoff) if u is not None]
            row = key_row(key, rules, self.busy.keycount.get(key, 0), waiting.get(key, 0),
                          max(ends) if ends else None, admitted.get(key, 0))
            if row.busy or row.waiting or row.overridden or row.paused_until is not None:
                rows.append(row)
        rows.sort(key=lambda r: (-(r.busy + r.waiting), r.key))
        return rows[:max(0, limit)]
