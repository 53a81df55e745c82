"""Rate-limit window maths, pure and clock-free (the caller passes ``now``).

The in-process backend uses these classes directly; the Lua scripts of the Redis backend
implement the same rules in milliseconds, and the contract kit holds both to them:

* ``fixed``: at most ``limit`` admissions per aligned window ``[k*period, (k+1)*period)``.
  Cheap, but up to ``2*limit`` can pass around a window edge.
* ``sliding``: an exact log; never more than ``limit`` admissions in any closed span of
  ``period`` seconds. A denied caller may come back at ``oldest + period`` (plus 1 ms so the
  closed span no longer holds the oldest).
* ``gcra``: the generic cell rate algorithm; admissions spaced ``period/limit`` apart, with
  up to ``burst`` at once after an idle spell.
"""

from __future__ import annotations

import math
from collections import deque

from ..config import RateLimit

#: The sliding window re-opens this long after the oldest admission leaves the span: the
#: span is closed at both ends, so the oldest must be strictly outside it.
EPSILON = 0.001


class RateWindow:
    """State of one queue's rate limit."""

    def __init__(self, rate: RateLimit) -> None:
        self.rate = rate

    def retry_at(self, now: float) -> float | None:
        """``None`` if one admission may pass at *now*, else the instant it may."""
        raise NotImplementedError

    def consume(self, now: float) -> None:
        """Record one admission at *now* (after :meth:`retry_at` said yes)."""
        raise NotImplementedError

    def used(self, now: float) -> int:
        """How much of the limit is in use at *now* (for operators)."""
        raise NotImplementedError


def fixed_window(now: float, period: float) -> int:
    """The number of the aligned fixed window holding *now*, counted in whole microseconds:
    ``floor(now / period)`` in floats puts an instant on a boundary in the window before it
    when the period has no exact binary form (``4.3 / 0.1 == 42.99999999999999``). The Lua
    twin (prelude.lua ``fixed_roll``, admit.lua's fast path) computes the same expression."""
    return math.floor(math.floor(now * 1e6 + 0.5) / max(1, math.floor(period * 1e6 + 0.5)))


class FixedWindow(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.window = -1
        self.count = 0

    def _roll(self, now: float) -> int:
        window = fixed_window(now, self.rate.period)
        if window != self.window:
            self.window, self.count = window, 0
        return window

    def retry_at(self, now: float) -> float | None:
        window = self._roll(now)
        if self.count < self.rate.limit:
            return None
        return (window + 1) * self.rate.period

    def consume(self, now: float) -> None:
        self._roll(now)
        self.count += 1

    def used(self, now: float) -> int:
        self._roll(now)
        return self.count


class SlidingWindow(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.times: deque[float] = deque()

    def _trim(self, now: float) -> None:
        start = now - self.rate.period
        while self.times and self.times[0] < start:
            self.times.popleft()

    def retry_at(self, now: float) -> float | None:
        self._trim(now)
        if len(self.times) < self.rate.limit:
            return None
        # The (limit)-th most recent admission must leave the span first.
        return self.times[-self.rate.limit] + self.rate.period + EPSILON

    def consume(self, now: float) -> None:
        self._trim(now)
        self.times.append(now)

    def used(self, now: float) -> int:
        self._trim(now)
        return len(self.times)


class GCRA(RateWindow):
    def __init__(self, rate: RateLimit) -> None:
        super().__init__(rate)
        self.interval = rate.period / rate.limit
        self.tolerance = self.interval * (rate.burst - 1)
        self.tat = 0.0  # theoretical arrival time of the next admission

    def retry_at(self, now: float) -> float | None:
        allow_at = self.tat - self.tolerance
        return None if now >= allow_at else allow_at

    def consume(self, now: float) -> None:
        self.tat = max(self.tat, now) + self.interval

    def used(self, now: float) -> int:
        return max(0, math.ceil((self.tat - now) / self.interval - 1e-9))


def make_window(rate: RateLimit) -> RateWindow:
    """The window class for ``rate.algorithm``."""
    return {"fixed": FixedWindow, "sliding": SlidingWindow, "gcra": GCRA}[rate.algorithm](rate)
