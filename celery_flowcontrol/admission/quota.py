"""The rate side of one flow queue: all its limits, per-key windows, backoffs, and the guard
that keeps a large cost from starving.

:class:`Quota` answers one question for :class:`~.queue_state.QueueState` before concurrency
is looked at: may this ticket's cost pass every rate limit now, and if not, at which one
instant will every one of them (and every backoff in force) admit it? It is the reference
model of ``redis/lua/quota.lua``; the state-machine test holds the two to the same answers.

- The queue's limits (``rate_limit``, one or a list) each have a window; a ticket's charge
  there is 1 (``per="call"``) or its cost (``per="cost"``).
- ``per_key_rate_limit``: a set of windows per ``fairness_key``, made on first charge and
  forgotten once all are empty again (:meth:`Quota.prune`), so 100,000 keys seen once cost
  nothing after their period.
- A backoff (``FlowBackoff``, ``backoff()``) pauses the queue, or one key, until an instant;
  a queue backoff halves every adaptive limit once (more backoffs while one is in force
  don't halve again: a burst of 429s is one signal, not many).
- No starvation: a waiter denied by the queue's limits joins the *rate line*, oldest first.
  Once its head has waited one period (of the limit that blocked it), every other caller of a
  smaller cost is denied until the head is in, with the instant the head's cost fits; unless the head did
  not come back within ``grant_ttl`` of its last retry_at (a lost waiter can't stall the
  queue: the next one in the rate line takes its place once it is pruned).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from ..config import MAX_KEY_BYTES, QueueConfig, RateLimit
from ..errors import CostRefusedError, FlowControlConfigError, SettleError
from .values import BACKOFF, KEY_RATE, MAX_COST, RATE, RateUse, Ticket
from .windows import EPSILON, RateWindow, SlidingWindow, make_window

#: The longest backoff one call may ask for (a day): a figure past it is a bug, not a quota.
MAX_BACKOFF = 86_400.0


#: The share of its estimated wait after which a waiter behind others comes back (Block.turn).
TURN_EARLY = 0.9


@dataclass(frozen=True)
class Block:
    """Why and until when a ticket can't pass: *period* is set when the queue's own limits
    held it (it joins the rate line), ``None`` for a key window or a backoff alone.

    *pace* is what one unit of charge takes of the window that holds it longest (its period /
    its limit; an adaptive limit's ceiling, so a turn errs early, never late), *per_cost* true
    if that window counts costs, *keyed* true if it is its key's: each waiter ahead of it in
    its line has its turn first (:meth:`turn`). *log* is that window when it is a sliding
    per-call one: its turns follow its entries (read at once, at the instant of the block)."""

    retry_at: float
    reason: str
    period: float | None
    pace: float = 0.0
    per_cost: bool = False
    keyed: bool = False
    log: SlidingWindow | None = field(default=None, compare=False, repr=False)

    def turn(self, ahead: int, mean_cost: float, now: float) -> float:
        """When a waiter with *ahead* waiters before it in its line may come back, the whole
        line not woken at once for one room.

        A sliding per-call log frees room exactly where its entries leave the span: the
        waiter comes back when the log has room for it after the *ahead* before it
        (:meth:`~.windows.SlidingWindow.room_at`); one a whole limit or more back, when the
        waiter a limit ahead of it (admitted then) leaves the span in turn, one period later.
        Elsewhere: the instant the limits let it in, one pace later for each waiter ahead (of
        *mean_cost*, where the window counts costs), and early by :data:`TURN_EARLY` of that:
        the estimate's errors (costs guessed from the line's head, refunds, waiters that
        leave) must leave the window full, not idle. One that comes early is denied again
        with a shorter estimate."""
        if self.log is not None:
            rounds, k = divmod(ahead, self.log.rate.limit)
            room = self.log.room_at(now, k)
            at = self.retry_at if room is None else max(self.retry_at, room)
            return at + rounds * (self.log.rate.period + EPSILON)
        return self.retry_at + TURN_EARLY * ahead * self.pace * (mean_cost if self.per_cost else 1)


@dataclass
class Charge:
    """What one admission charged, so :meth:`Quota.settle` can correct it: the cost, the key,
    one token per queue window and per key window, and whether it was settled."""

    cost: float
    key: str
    tokens: tuple[int, ...]
    key_tokens: tuple[int, ...]
    epochs: tuple[int, int]  # of the queue's and the keys' windows when charged
    settled: bool = False
    key_rates: tuple[RateLimit, ...] = ()  # the key's limits when charged


class KeyState:
    """One fairness key's windows (of its own limits, else the per-key ones) and backoff."""

    def __init__(self, rates: tuple[RateLimit, ...]) -> None:
        self.rates = rates
        self.windows: list[RateWindow] = [make_window(r) for r in rates]
        self.until: float | None = None

    def end(self) -> float:
        ends = [w.end() for w in self.windows]
        if self.until is not None:
            ends.append(self.until)
        return max(ends, default=-math.inf)


def check_actual(slot_id: str, actual: object) -> float:
    """*actual* as a settled cost: a finite number >= 0, else :class:`SettleError`."""
    if (isinstance(actual, bool) or not isinstance(actual, (int, float))
            or not 0 <= actual <= MAX_COST):
        raise SettleError(f"the actual cost must be a finite number >= 0 and at most "
                          f"{MAX_COST:g}, got {actual!r}", slot_id)
    return actual


def check_backoff(queue: str, seconds: object, key: object) -> float:
    """Validate a backoff's length (seconds, > 0, at most a day) and key (text or ``None``)."""
    if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
            or not 0 < seconds <= MAX_BACKOFF):
        raise FlowControlConfigError(
            f"must be a number of seconds > 0 and at most {MAX_BACKOFF:g}, got {seconds!r}",
            queue, "backoff")
    if key is not None and (not isinstance(key, str) or len(key.encode("utf-8", "surrogatepass"))
                            > MAX_KEY_BYTES):
        raise FlowControlConfigError(
            f"must be None or text of at most {MAX_KEY_BYTES} bytes, got {key!r}", queue,
            "fairness_key")
    return float(seconds)


class Quota:
    """Every rate limit, per-key window and backoff of one queue. Not thread-safe."""

    def __init__(self, config: QueueConfig, grant_ttl: float,
                 key_rates: Callable[[str], tuple[RateLimit, ...]] | None = None) -> None:
        self.config = config
        self.grant_ttl = grant_ttl
        #: A key's limits: its own (``keys=``, ``set_key``), else ``per_key_rate_limit``'s.
        self.key_rates = key_rates or (lambda key: self.config.per_key_rate_limits)
        self.windows: list[RateWindow] = [make_window(r) for r in config.rate_limits]
        # Bumped when the windows are made anew: a charge made in older ones is past.
        self.epochs = (0, 0)
        self.keys: dict[str, KeyState] = {}
        self.key_expiry: SortedList = SortedList()   # (end, key)
        self.key_end: dict[str, float] = {}
        self.until: float | None = None               # the queue's backoff
        self.line: SortedList = SortedList()          # the rate line: (since, task id)
        # task -> (since, cost, period, retry_at of its last denial)
        self.lined: dict[str, tuple[float, float, float, float]] = {}

    def configure(self, config: QueueConfig) -> None:
        """Take *config*: windows restart only where their limits changed."""
        old, self.config = self.config, config
        if old.rate_limits != config.rate_limits:
            self.windows = [make_window(r) for r in config.rate_limits]
            self.epochs = (self.epochs[0] + 1, self.epochs[1])
        if old.per_key_rate_limits != config.per_key_rate_limits:
            self.epochs = (self.epochs[0], self.epochs[1] + 1)
            self.keys.clear()
            self.key_expiry.clear()
            self.key_end.clear()
        elif old.keys != config.keys:
            for key in list(self.keys):
                self.refit(key)

    def refit(self, key: str) -> None:
        """*key*'s limits may have changed (``keys=``, ``set_key``): its windows restart if
        they did (a backoff in force stays)."""
        ks = self.keys.get(key)
        rates = self.key_rates(key)
        if ks is None or ks.rates == rates:
            return
        fresh = KeyState(rates)
        fresh.until = ks.until
        self.keys[key] = fresh
        self._track(key, fresh)

    def cost_limit(self, key: str) -> tuple[float, RateLimit | None]:
        """The largest cost a ticket of *key* may have, and the limit that sets it."""
        best: tuple[float, RateLimit | None] = (math.inf, None)
        for r in (*self.config.rate_limits, *self.key_rates(key)):
            if r.per == "cost" and r.max_charge < best[0]:
                best = (r.max_charge, r)
        return best
    # -- cost ---------------------------------------------------------------------------------
    def check_cost(self, t: Ticket) -> None:
        """:class:`CostRefusedError` if no window can ever admit *t*'s cost."""
        most, rate = self.cost_limit(t.fairness_key)
        if t.cost > most:
            assert rate is not None
            raise CostRefusedError(
                f"cost {t.cost:g} is above what the limit {rate.describe()} admits at once "
                f"({most:g}): it can never run", self.config.name, "flow_cost")

    # -- deciding -----------------------------------------------------------------------------
    def _key_state(self, key: str) -> KeyState | None:
        return self.keys.get(key)

    def key_holds(self, key: str, cost: float, now: float) -> bool:
        """True if *key*'s own windows or backoff keep a ticket of *cost* out now, or if no
        window admits that cost any more (a waiter from before its limits were lowered)."""
        if cost > self.cost_limit(key)[0]:
            return True
        ks = self._key_state(key)
        if ks is None:
            return False
        if ks.until is not None and ks.until > now:
            return True
        return any(w.retry_at(now, w.charge_of(cost)) is not None for w in ks.windows)

    def _own(self, t: Ticket, now: float) -> Block | None:
        """What the windows and backoffs say of *t* alone. The block names the period of
        the queue window that holds *t* longest (it joins the rate line, :meth:`blocked`)
        only while its key's own limits would let it in no later: a queue's room kept for
        a task its own key holds back serves nobody."""
        worst: float | None = None
        period: float | None = None
        binding: RateWindow | None = None
        for w in self.windows:
            at = w.retry_at(now, w.charge_of(t.cost))
            if at is not None and (worst is None or at > worst):
                worst, period, binding = at, w.rate.period, w
        limits = worst
        keyed = False
        ks = self._key_state(t.fairness_key)
        if ks is not None:
            for w in ks.windows:
                at = w.retry_at(now, w.charge_of(t.cost))
                if at is not None and (limits is None or at > limits):
                    limits, binding, keyed = at, w, True
            if ks.until is not None and ks.until > now:
                period = None
        if worst is not None and limits is not None and limits > worst:
            period = None
        key_until = ks.until if ks is not None else None
        paused = max((u for u in (self.until, key_until) if u is not None and u > now),
                     default=None)
        if paused is not None and (limits is None or paused >= limits):
            return Block(paused, BACKOFF, period)
        if limits is None or binding is None:
            return None
        log = binding if isinstance(binding, SlidingWindow) and binding.rate.per == "call" else None
        return Block(limits, KEY_RATE if keyed else RATE, period,
                     binding.rate.period / binding.rate.limit,
                     binding.rate.per == "cost", keyed, log)

    def check(self, t: Ticket, now: float) -> Block | None:
        """``None`` if *t* may pass every limit now, else why and until when (the guard for
        the rate line's head included)."""
        own = self._own(t, now)
        if not self.line:
            return own
        since, head = self.line[0]
        if head == t.task_id:
            return own
        _, cost, period, due = self.lined[head]
        if now < since + period or now >= due + self.grant_ttl or t.cost >= cost:
            # Not starved yet; or it did not come back at its turn within grant_ttl (as a
            # grant passes on), so the others are not kept waiting for it; or this caller
            # costs no less than the head (it takes no room the head could use that the head
            # would not take itself: with equal costs any caller may have the window, as
            # before, so a rate line of cost-1 tasks runs at the limit, not at the wake rate).
            return own
        # The head has waited a period: the windows are kept for it.
        at = None
        for w in self.windows:
            r = w.retry_at(now, w.charge_of(cost))
            if r is not None and (at is None or r > at):
                at = r
        if at is None:
            at = now + self.config.retry
        if own is not None and own.retry_at >= at:
            return own
        return Block(at, RATE, period)

    def consume(self, t: Ticket, now: float) -> Charge:
        """Charge *t* in every window (after :meth:`check` said yes); it leaves the rate line."""
        tokens = tuple(w.consume(now, w.charge_of(t.cost)) for w in self.windows)
        key_tokens: tuple[int, ...] = ()
        rates = self.key_rates(t.fairness_key)
        if rates:
            ks = self._state_for(t.fairness_key)
            key_tokens = tuple(w.consume(now, w.charge_of(t.cost)) for w in ks.windows)
            self._track(t.fairness_key, ks)
        self.unline(t.task_id)
        return Charge(t.cost, t.fairness_key, tokens, key_tokens, self.epochs, key_rates=rates)

    def _state_for(self, key: str) -> KeyState:
        ks = self.keys.get(key)
        if ks is None:
            ks = self.keys[key] = KeyState(self.key_rates(key))
        return ks

    def _track(self, key: str, ks: KeyState) -> None:
        old = self.key_end.get(key)
        if old is not None:
            self.key_expiry.remove((old, key))
        end = self.key_end[key] = ks.end()
        self.key_expiry.add((end, key))

    # -- the rate line ------------------------------------------------------------------------
    def blocked(self, task_id: str, since: float, cost: float, block: Block | None) -> None:
        """Waiter *task_id* was just denied by *block*: in the rate line while the queue's
        limits hold it (keeping its place), out of it otherwise."""
        if block is None or block.period is None:
            self.unline(task_id)
            return
        old = self.lined.get(task_id)
        if old is None:
            self.line.add((since, task_id))
            self.lined[task_id] = (since, cost, block.period, block.retry_at)
        else:
            self.lined[task_id] = (old[0], old[1], old[2], block.retry_at)

    def unline(self, task_id: str) -> None:
        entry = self.lined.pop(task_id, None)
        if entry is not None:
            self.line.remove((entry[0], task_id))

    # -- settle and backoff -------------------------------------------------------------------
    def settle(self, charge: Charge, actual: float, now: float) -> bool:
        """Correct *charge* to *actual* in every ``per="cost"`` window that counted it; True
        if room was given back (a refund where a cost window counts)."""
        cost_windows = False
        same = (charge.epochs[0] == self.epochs[0], charge.epochs[1] == self.epochs[1])
        for w, token in zip(self.windows, charge.tokens, strict=True) if same[0] else ():
            if w.rate.per == "cost":
                w.settle(token, charge.cost, actual, now)
                cost_windows = True
        if charge.key_tokens and same[1] and self.key_rates(charge.key) == charge.key_rates:
            ks = self._state_for(charge.key)
            for w, token in zip(ks.windows, charge.key_tokens, strict=True):
                if w.rate.per == "cost":
                    w.settle(token, charge.cost, actual, now)
                    cost_windows = True
            self._track(charge.key, ks)
        charge.settled = True
        return cost_windows and actual < charge.cost

    def backoff(self, seconds: float, key: str | None, now: float) -> float:
        """Admit nothing of the queue (or of *key*) until ``now + seconds``; that instant."""
        until = now + seconds
        if key is None:
            if self.until is None or self.until <= now:
                for w in self.windows:
                    if w.rate.adaptive:
                        w.halve(now)
            if self.until is None or until > self.until:
                self.until = until
            return self.until
        ks = self._state_for(key)
        if ks.until is None or until > ks.until:
            ks.until = until
        self._track(key, ks)
        return ks.until

    # -- upkeep and reads ---------------------------------------------------------------------
    def prune(self, now: float, limit: int | None) -> int:
        """Forget keys whose windows are all empty and whose backoff is over."""
        done = 0
        while self.key_expiry and self.key_expiry[0][0] < now and (limit is None or done < limit):
            _, key = self.key_expiry.pop(0)
            del self.key_end[key]
            del self.keys[key]
            done += 1
        return done

    def uses(self, now: float) -> tuple[RateUse, ...]:
        out = []
        for w in self.windows:
            used = w.used(now)
            live = w.limit_at(now) if w.rate.adaptive else None
            out.append(RateUse(w.rate, used, live))
        return tuple(out)

    def backoff_until(self, now: float) -> float | None:
        return self.until if self.until is not None and self.until > now else None
