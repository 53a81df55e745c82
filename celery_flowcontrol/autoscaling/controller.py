"""The adaptive concurrency controller: one pure function of the last tick's samples.

It knows nothing of Celery, processes or wall clocks. Each tick the caller hands it a
:class:`TickSample` (what finished, what failed, what is in flight, RAM and CPU) and gets a
:class:`Adjustment` back: the new limit and why. Time comes from an injectable ``clock`` so the
virtual-clock simulation and the unit tests drive it exactly.

The policy is Vegas/Gradient-like, tuned for pools of at most a few dozen slots:

* **baseline**: the minimum of per-tick p50 latencies over the last ``baseline_window`` ticks
  (each smoothed as the median of three neighbouring ticks). A median of several tasks, never one
  lucky sample; old minima age out, so a downstream that became slower for good is re-measured.
* **grow** by +1 when p50 <= ``tolerance`` x baseline and there is demand for another slot: at
  least half the slots busy, and most arriving tasks (``queued_share`` >= ``grow_queued``) found
  every slot taken (or, when no arrival was seen, ``grow_busy`` of the slots busy on average).
  Arrivals are the better sign under prefork: per-task overhead keeps the runtime-based busy
  figure below the slot count even under a backlog. Green pools report no arrivals (they say
  nothing about demand there; see :mod:`celery_flowcontrol.autoscale`), so busy decides.
* **shrink** multiplicatively when p50 > ``shrink_tolerance`` x baseline (queuing): by the gradient
  ``tolerance*baseline/p50``, clamped to [0.5, 0.9], so a small excess trims one slot and a large
  one halves. Between the two tolerances it holds: the band keeps a pool of a few slots from
  swinging on sampling noise (the Vegas alpha/beta idea, relative instead of a queue allowance).
* a tick with fewer than ``min_samples`` latencies carries them into the next one, so slow tasks
  still get a median of several samples, just less often.
* **idle**: more than a slot idle and no demand for ``idle_ticks`` ticks (one, with two slots or
  more idle): down to one spare slot above the busiest of those ticks (so light load keeps about
  offered load + 1.5 slots).
* **errors/stalls** above ``drop_ratio`` cut at least 50% at once; once latency is good again
  the limit doubles back towards where it was before the errors (slow start), then probes +1.
* **RAM/CPU** at or above their ceilings cut; within ``headroom_pct`` points below, no growth.
* **no stacked cuts**: after a cut, nothing is cut again until the tasks actually in flight fit
  under the limit (busy prefork children are never terminated; they finish first).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["Adjustment", "GradientController", "TickSample", "percentile"]


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Return the ``pct`` percentile (0..100) of ``values`` by nearest rank, or None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class TickSample:
    """What happened during one tick, as seen by the worker.

    ``latencies``: seconds taken by each task that finished (successes and business errors);
    ``drops``: tasks that ended in a timeout, a lost worker or an infrastructure error;
    ``stalled``: tasks still in flight for longer than the stall threshold;
    ``inflight``: tasks running at the end of the tick (the concurrency actually in force);
    ``busy``: mean tasks in flight over the tick (task-seconds / tick length, Little's law);
    ``queued_share``: share of tasks arriving in the tick that found every slot taken (None: unknown);
    ``ram_pct``/``cpu_pct``: gauges, None when unknown.
    """

    latencies: Sequence[float] = ()
    drops: int = 0
    stalled: int = 0
    inflight: int = 0
    busy: float = 0.0
    ram_pct: float | None = None
    cpu_pct: float | None = None
    queued_share: float | None = None


@dataclass(frozen=True)
class Adjustment:
    """The controller's answer for one tick: the new ``limit``, the ``previous`` one and ``reason``."""

    limit: int
    previous: int
    reason: str
    at: float
    p50: float | None = None
    p95: float | None = None
    baseline: float | None = None

    @property
    def changed(self) -> bool:
        """True when the limit moved this tick."""
        return self.limit != self.previous


@dataclass
class GradientController:
    """Adaptive concurrency limit between ``min_limit`` and ``max_limit``; see the module docstring."""

    min_limit: int = 1
    max_limit: int = 32
    start: int | None = None
    tolerance: float = 1.15
    shrink_tolerance: float = 1.25
    baseline_window: int = 30
    min_samples: int = 10
    grow_busy: float = 0.8
    grow_queued: float = 0.75
    drop_ratio: float = 0.05
    ram_ceiling_pct: float | None = 85.0
    cpu_ceiling_pct: float | None = None
    headroom_pct: float = 5.0
    idle_ticks: int = 2
    clock: Callable[[], float] = time.monotonic
    limit: int = field(init=False)
    last: Adjustment | None = field(init=False, default=None)
    _p50s: deque[float] = field(init=False, repr=False)
    _idle: int = field(init=False, default=0, repr=False)
    _idle_busy: float = field(init=False, default=0.0, repr=False)
    _carry: list[float] = field(init=False, default_factory=list, repr=False)
    _recover_to: int = field(init=False, default=0, repr=False)
    _recovered: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        start = self.min_limit if self.start is None else self.start
        self.limit = max(self.min_limit, min(self.max_limit, start))
        self._p50s = deque(maxlen=self.baseline_window + 2)

    @property
    def baseline(self) -> float | None:
        """The windowed minimum of per-tick p50 latencies, None until one tick had enough samples.

        Each point is the median of three consecutive per-tick p50s, so one tick's lucky
        median (sampling noise of a few percent) can't set the bar for the whole window.
        """
        p = list(self._p50s)
        if len(p) < 3:
            return min(p) if p else None
        return min(sorted(p[i - 2 : i + 1])[1] for i in range(2, len(p)))

    def set_bounds(self, min_limit: int | None = None, max_limit: int | None = None) -> int:
        """Change the bounds (the ``autoscale`` remote command); returns the clamped limit."""
        if max_limit is not None:
            self.max_limit = max_limit
        if min_limit is not None:
            self.min_limit = min_limit
        self.limit = max(self.min_limit, min(self.max_limit, self.limit))
        return self.limit

    def tick(self, sample: TickSample) -> Adjustment:
        """Decide the limit for the next tick from ``sample``; never stacks cuts."""
        previous = self.limit
        latencies = self._carry + list(sample.latencies)
        p50 = percentile(latencies, 50)
        p95 = percentile(latencies, 95)
        enough = len(latencies) >= self.min_samples
        # Too few to trust a median: keep them for the next tick (bounded, newest kept).
        self._carry = [] if enough else latencies[-self.min_samples :]
        if enough and p50 is not None:
            self._p50s.append(p50)
        limit, reason = self._decide(sample, p50 if enough else None)
        if limit < previous:
            # After a cut, samples taken at the old concurrency must not drive the next decision.
            self._carry = []
        self.limit = max(self.min_limit, min(self.max_limit, limit))
        self.last = Adjustment(self.limit, previous, reason, self.clock(), p50, p95, self.baseline)
        return self.last

    def _decide(self, s: TickSample, p50: float | None) -> tuple[int, str]:
        limit = self.limit
        # The concurrency actually in force: a cut is in effect once what runs fits under it.
        running = max(s.inflight, round(s.busy), 1)
        if s.inflight > limit:
            return limit, f"waiting: {s.inflight} in flight above limit {limit}"
        ram, cpu = s.ram_pct, s.cpu_pct
        for name, value, ceiling in (("ram", ram, self.ram_ceiling_pct), ("cpu", cpu, self.cpu_ceiling_pct)):
            if value is not None and ceiling is not None and value >= ceiling:
                # Proportional to the excess, at least one slot: aim a margin under the ceiling.
                target = math.floor(running * (ceiling - self.headroom_pct) / max(value, 1.0))
                return min(limit - 1, running - 1, target), f"{name} {value:.1f}% >= ceiling {ceiling:g}%"
        finished = len(s.latencies) + s.drops
        bad = s.drops + s.stalled
        if bad and bad / max(finished + s.stalled, 1) > self.drop_ratio:
            # Remember where we were: once the errors stop, climb back by doubling (slow start).
            # Errors again after climbing back means that level is gone: probe +1 from here on.
            self._recover_to = 0 if self._recovered else max(self._recover_to, limit)
            self._recovered = False
            return limit // 2, f"drops {bad}/{finished + s.stalled} above {self.drop_ratio:.0%}"
        baseline = self.baseline
        if p50 is not None and baseline is not None and p50 > self.shrink_tolerance * baseline:
            self._recover_to = 0  # latency says the old level was too high: don't climb back to it
            factor = min(0.9, max(0.5, self.tolerance * baseline / p50))
            # Scale what ran, plus the slot that is usually between two tasks on a real worker
            # (dispatch and ack take time), so a mild excess trims one slot, not two.
            target = min(limit - 1, math.floor(min(limit, running + 1) * factor))
            return target, (
                f"queuing: p50 {p50 * 1000:.0f}ms > {self.shrink_tolerance:g} x baseline {baseline * 1000:.0f}ms"
            )
        # Arrivals that found every slot taken are the direct sign of demand; without them
        # (no arrivals seen this tick) fall back to the runtime-based busy figure.
        if s.queued_share is not None:
            demand = s.queued_share >= self.grow_queued
        else:
            demand = s.busy >= self.grow_busy * limit
        busy_enough = s.busy >= 0.5 * limit and demand
        if not busy_enough:
            # More than a slot idle on average and no demand, for ``idle_ticks`` ticks in a row
            # (one tick when two slots or more sat idle: after a burst, or a ramp that overshot):
            # come down to one spare slot above the busiest of those ticks (at least one slot
            # less). Checked before the sample count, so a pool with no traffic at all decays too.
            self._idle_busy = max(self._idle_busy, s.busy) if self._idle else s.busy
            self._idle = self._idle + 1 if s.busy <= limit - 1 else 0
            needed = 1 if s.busy <= limit - 2 else self.idle_ticks
            if self._idle >= needed and limit > self.min_limit:
                self._idle = 0
                target = min(limit - 1, math.ceil(self._idle_busy) + 1)
                return target, f"idle: busy {self._idle_busy:.1f} at most, of {limit}"
            return limit, f"holding: busy {s.busy:.1f} of {limit}, not enough to probe"
        self._idle = 0
        if p50 is None or baseline is None:
            return limit, "holding: too few samples"
        if p50 > self.tolerance * baseline:
            return limit, "holding: p50 inside the tolerance band"
        if self._near_ceiling(ram, self.ram_ceiling_pct) or self._near_ceiling(cpu, self.cpu_ceiling_pct):
            return limit, "holding: near a resource ceiling"
        if limit < self._recover_to:
            self._recovered = True
            return min(2 * limit, self._recover_to), f"recovering towards {self._recover_to}"
        self._recover_to = 0
        if limit < self.max_limit:
            return limit + 1, f"probe: p50 {p50 * 1000:.0f}ms within tolerance, busy {s.busy:.1f}/{limit}"
        return limit, "holding: at max"

    def _near_ceiling(self, value: float | None, ceiling: float | None) -> bool:
        return value is not None and ceiling is not None and value >= ceiling - self.headroom_pct
