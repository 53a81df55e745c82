"""Rate-limit window maths, pure and clock-free (the caller passes ``now``).

The in-process backend uses these classes directly; the Lua scripts of the Redis backend
implement the same rules in milliseconds (``redis/lua/windows.lua``), and the contract kit and
the state-machine test hold both to them. Every window is charged a *charge* per admission:
1 for a ``per="call"`` limit, the ticket's cost for a ``per="cost"`` one.

* ``fixed``: at most ``limit`` per aligned window ``[k*period, (k+1)*period)``. Cheap, but up
  to ``2*limit`` can pass around a window edge.
* ``sliding``: an exact log; never more than ``limit`` in any closed span of ``period``
  seconds. A denied caller may come back once enough of the oldest charges left the span
  (at their time ``+ period``, plus 1 ms so the closed span no longer holds them).
* ``gcra``: the generic cell rate algorithm; one unit spaced ``period/limit`` apart, with up
  to ``burst`` units at once after an idle spell.

``adaptive=True`` (queue windows only): the limit is a ceiling and the window counts against
a *live* limit that a backoff halves (:meth:`RateWindow.halve`) and that each whole period
without one raises by a tenth of the ceiling (AIMD), computed lazily at each read.

A charge can be corrected after the fact (:meth:`RateWindow.settle`, for ``settle_cost``):
as if the true figure had been charged at admission, never below zero, and only while the
charge still counts (a fixed window that rolled, or a log entry that left the span, is past).
"""

from __future__ import annotations

import math
from collections import deque

from ..config import RateLimit

#: The sliding window re-opens this long after the oldest admission leaves the span: the
#: span is closed at both ends, so the oldest must be strictly outside it.
EPSILON = 0.001


def fixed_window(now: float, period: float) -> int:
    """The number of the aligned fixed window holding *now*, counted in whole microseconds:
    ``floor(now / period)`` in floats puts an instant on a boundary in the window before it
    when the period has no exact binary form (``4.3 / 0.1 == 42.99999999999999``). The Lua
    twin (windows.lua ``roll``) computes the same expression."""
    return math.floor(math.floor(now * 1e6 + 0.5) / max(1, math.floor(period * 1e6 + 0.5)))


class RateWindow:
    """State of one rate limit (of a queue, or of one fairness key of it)."""

    def __init__(self, rate: RateLimit) -> None:
        self.rate = rate
        self.live = rate.limit       # the live limit (the limit itself unless adaptive)
        self.since: float | None = None  # adaptive: start of the period being counted

    # -- the live limit (AIMD) ----------------------------------------------------------------
    def step(self) -> int:
        """What a period without backoff adds back: a tenth of the ceiling, at least 1."""
        return max(1, self.rate.limit // 10)

    def limit_at(self, now: float) -> int:
        """The limit in force at *now* (raised for each whole period since the last change)."""
        if self.rate.adaptive:
            if self.since is None:
                self.since = now
            n = math.floor((now - self.since) / self.rate.period)
            if n > 0:
                self.live = min(self.rate.limit, self.live + n * self.step())
                self.since = self.since + n * self.rate.period
        return self.live

    def halve(self, now: float) -> None:
        """A backoff: the live limit halves (at least 1), and a new period starts."""
        self.live = max(1, self.limit_at(now) // 2)
        self.since = now

    def raised_at(self, now: float, charge: float) -> float:
        """When the live limit will have risen to *charge* (``charge <= ceiling``)."""
        live = self.limit_at(now)
        assert self.since is not None
        return self.since + math.ceil((charge - live) / self.step()) * self.rate.period

    def charge_of(self, cost: float) -> float:
        return cost if self.rate.per == "cost" else 1

    # -- the window ---------------------------------------------------------------------------
    def retry_at(self, now: float, charge: float = 1) -> float | None:
        """``None`` if a *charge* may pass at *now*, else the instant it may."""
        raise NotImplementedError

    def consume(self, now: float, charge: float = 1) -> int:
        """Record a *charge* at *now* (after :meth:`retry_at` said yes); a token for
        :meth:`settle`."""
        raise NotImplementedError

    def settle(self, token: int, charged: float, actual: float, now: float) -> None:
        """Correct a *charged* amount (recorded under *token*) to *actual*."""
        raise NotImplementedError

    def used(self, now: float) -> float:
        """How much of the limit is in use at *now* (for operators)."""
        raise NotImplementedError

    def end(self) -> float:
        """After this instant the window is empty, as good as new (per-key windows go then)."""
        raise NotImplementedError


class FixedWindow(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.window = -1
        self.count: float = 0

    def _roll(self, now: float) -> int:
        window = fixed_window(now, self.rate.period)
        if window != self.window:
            self.window, self.count = window, 0
        return window

    def retry_at(self, now: float, charge: float = 1) -> float | None:
        window = self._roll(now)
        limit = self.limit_at(now)
        if charge > limit:
            return self.raised_at(now, charge)
        if self.count + charge <= limit:
            return None
        return (window + 1) * self.rate.period

    def consume(self, now: float, charge: float = 1) -> int:
        window = self._roll(now)
        self.count += charge
        return window

    def settle(self, token: int, charged: float, actual: float, now: float) -> None:
        if self._roll(now) == token:
            self.count = max(0, self.count + (actual - charged))

    def used(self, now: float) -> float:
        self._roll(now)
        return self.count

    def end(self) -> float:
        return (self.window + 1) * self.rate.period


class SlidingWindow(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.log: deque[tuple[float, int, float]] = deque()  # (time, seq, charge)
        self.total: float = 0
        self.seq = 0

    def _trim(self, now: float) -> None:
        start = now - self.rate.period
        while self.log and self.log[0][0] < start:
            self.total -= self.log.popleft()[2]
        if not self.log:
            self.total = 0

    def retry_at(self, now: float, charge: float = 1) -> float | None:
        self._trim(now)
        limit = self.limit_at(now)
        if charge > limit:
            return self.raised_at(now, charge)
        if self.total + charge <= limit:
            return None
        # The oldest charges must leave the span until this one fits.
        rest = self.total
        for at, _, c in self.log:
            rest -= c
            if rest + charge <= limit:
                return at + self.rate.period + EPSILON
        raise AssertionError("unreachable: an empty log admits any charge <= limit")

    def room_at(self, now: float, k: int) -> float | None:
        """Per call: when the log has room for the *k*-th charge after those it holds (from
        0, below the limit): the instant the entry ``k`` places past the oldest that must
        leave first leaves the span; ``None`` if none need leave. The ceiling counts, so an
        adaptive limit's turn errs early, never late."""
        self._trim(now)
        i = len(self.log) - self.rate.limit + k
        return self.log[i][0] + self.rate.period + EPSILON if i >= 0 else None

    def consume(self, now: float, charge: float = 1) -> int:
        self._trim(now)
        self.seq += 1
        self.log.append((now, self.seq, charge))
        self.total += charge
        return self.seq

    def settle(self, token: int, charged: float, actual: float, now: float) -> None:
        self._trim(now)
        for i, (at, seq, c) in enumerate(self.log):
            if seq == token:
                self.log[i] = (at, seq, actual)
                self.total = max(0, self.total + (actual - c))
                return

    def used(self, now: float) -> float:
        self._trim(now)
        return self.total

    def end(self) -> float:
        return self.log[-1][0] + self.rate.period if self.log else -math.inf


class GCRA(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.tat = 0.0  # theoretical arrival time of the next unit

    def _interval(self, now: float) -> float:
        return self.rate.period / self.limit_at(now)

    def retry_at(self, now: float, charge: float = 1) -> float | None:
        interval = self._interval(now)
        allow_at = self.tat - interval * (self.rate.burst - charge)
        return None if now >= allow_at else allow_at

    def consume(self, now: float, charge: float = 1) -> int:
        self.tat = max(self.tat, now) + self._interval(now) * charge
        return 0

    def settle(self, token: int, charged: float, actual: float, now: float) -> None:
        self.tat = max(max(self.tat, now) + self._interval(now) * (actual - charged), now)

    def used(self, now: float) -> float:
        return max(0, math.ceil((self.tat - now) / self._interval(now) - 1e-9))

    def end(self) -> float:
        return self.tat


def make_window(rate: RateLimit) -> RateWindow:
    """The window class for ``rate.algorithm``."""
    return {"fixed": FixedWindow, "sliding": SlidingWindow, "gcra": GCRA}[rate.algorithm](rate)
