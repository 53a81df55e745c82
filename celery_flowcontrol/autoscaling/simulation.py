"""A deterministic virtual-clock model of the knee-server benchmark, for the test suite.

The same scenarios as ``benchmarks/autoscale.py``, in seconds instead of minutes: a downstream
with K slots (lognormal 50 ms, sigma 0.2, flat up to K in flight; above K requests queue and each
one above K adds 3% to service time; above 2K a fast 503), a worker whose tasks make one request
each, and a concurrency limit that is either fixed, Celery's stock behaviour under a backlog
(every slot up to ``max`` busy), the :class:`GradientController` ticking on the virtual clock, or
an oracle: a limit set from outside at every instant (``limit_at``, e.g. the best fixed
concurrency for the K in force), the bound no controller that only sees the worker can beat.

The worker side mirrors prefork under ``task_acks_late`` and prefetch 1: a new task starts only
while fewer than ``limit`` are in flight, and a cut never stops a running task; it takes effect as
tasks finish. Everything is seeded, so a scenario gives the same figures on every run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .controller import Adjustment, GradientController, percentile
from .recorder import TickRecorder

__all__ = ["KneeServer", "SimResult", "TickRow", "simulate"]


@dataclass
class KneeServer:
    """The downstream: ``k_at(t)`` slots, stalls in ``stalls`` windows ``(start, end)``."""

    k_at: Callable[[float], int]
    base: float = 0.050
    sigma: float = 0.2
    penalty: float = 0.03
    fast_fail: float = 0.001
    stalls: tuple[tuple[float, float], ...] = ()
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def service_time(self, now: float, inflight: int) -> float:
        """Time one request takes once it holds a slot, with ``inflight`` requests at the server."""
        k = self.k_at(now)
        mu = math.log(self.base) - self.sigma**2 / 2  # so the mean is ``base``
        t = self.rng.lognormvariate(mu, self.sigma) * (1 + self.penalty * max(0, inflight - k))
        for start, end in self.stalls:
            if start <= now < end:
                return end - now + t
        return t


@dataclass(frozen=True)
class TickRow:
    """One tick of a run: time, K, limit, pool size, tasks in flight, the RAM the controller saw, the decision."""

    t: float
    k: int
    limit: int
    pool: int
    inflight: int
    ram: float | None
    decision: Adjustment | None


@dataclass
class SimResult:
    """Per-task outcomes ``(end, latency, ok)`` and per-tick rows of one simulated run."""

    tasks: list[tuple[float, float, bool]]
    ticks: list[TickRow]
    ram_peak: float | None
    pool_seconds: float
    duration: float
    ram_trace: list[tuple[float, float]] = field(default_factory=list)

    def window(self, start: float, end: float) -> dict[str, float]:
        """Throughput (ok/s), p95 of ok latencies, error ratio and mean limit in ``[start, end)``."""
        ok = [lat for t, lat, good in self.tasks if start <= t < end and good]
        bad = sum(1 for t, _, good in self.tasks if start <= t < end and not good)
        rows = [r for r in self.ticks if start <= r.t < end]
        return {
            "throughput": len(ok) / (end - start),
            "p95": percentile(ok, 95) or 0.0,
            "errors": bad / max(len(ok) + bad, 1),
            "mean_limit": sum(r.limit for r in rows) / max(len(rows), 1),
            "mean_pool": sum(r.pool for r in rows) / max(len(rows), 1),
        }


def simulate(
    server: KneeServer,
    duration: float,
    *,
    controller: GradientController | None = None,
    fixed: int | None = None,
    limit_at: Callable[[float], int] | None = None,
    tick: float = 1.0,
    arrival_rate: float | None = None,
    client_timeout: float = 1.0,
    overhead: float = 0.002,
    early_drops: int = 8,
    ram: Callable[[float, int], float] | None = None,
    seed: int = 11,
) -> SimResult:
    """Run one arm for ``duration`` virtual seconds; backlog unless ``arrival_rate`` (Poisson) is set.

    The limit comes from ``controller`` (on each tick), ``limit_at(now)`` (before every event:
    the oracle) or ``fixed``. Either way a cut never stops a running task.
    """
    now = 0.0
    recorder = TickRecorder(clock=lambda: now)
    if controller is not None:
        controller.clock = lambda: now
    rng = random.Random(seed)
    seq = itertools.count()
    events: list[tuple[float, int, str, int]] = []
    if controller is not None:
        limit = controller.limit
    else:
        limit = limit_at(0.0) if limit_at is not None else (fixed or 1)
    state = {"inflight": 0, "pool": limit, "server": 0, "busy_slots": 0, "queued": 0}
    started: dict[int, float] = {}
    done: set[int] = set()
    server_queue: list[int] = []
    tasks: list[tuple[float, float, bool]] = []
    ticks: list[TickRow] = []
    ram_peak: float | None = None
    ram_trace: list[tuple[float, float]] = []
    pool_seconds = 0.0
    last_pool_t = 0.0

    def push(at: float, kind: str, ident: int = 0) -> None:
        heapq.heappush(events, (at, next(seq), kind, ident))

    def note_ram() -> None:
        nonlocal ram_peak
        if ram is not None:
            value = ram(now, state["inflight"])
            ram_trace.append((now, value))
            ram_peak = value if ram_peak is None else max(ram_peak, value)

    def set_pool(value: int) -> None:
        nonlocal pool_seconds, last_pool_t
        pool_seconds += state["pool"] * (now - last_pool_t)
        last_pool_t = now
        state["pool"] = value

    def start_tasks() -> None:
        while state["inflight"] < limit and (arrival_rate is None or state["queued"] > 0):
            if arrival_rate is not None:
                state["queued"] -= 1
            else:
                recorder.arrived(full=True)  # a backlog: each task taken had been waiting for a slot
            ident = next(seq)
            state["inflight"] += 1
            started[ident] = now
            push(now + overhead, "request", ident)
            push(now + overhead + client_timeout, "timeout", ident)
        note_ram()

    def finish(ident: int, ok: bool) -> None:
        if ident in done:
            return
        done.add(ident)
        latency = now - started.pop(ident) - overhead
        tasks.append((now, latency, ok))
        recorder.record(latency, dropped=not ok)
        state["inflight"] -= 1
        if (
            controller is not None
            and not ok
            and controller.limit > controller.min_limit  # as the autoscaler: only when it can cut
            and state["inflight"] <= controller.limit
            and recorder.drop_burst(early_drops, controller.drop_ratio)
        ):
            control(ram(now, state["inflight"]) if ram is not None else None)
        # Prefork shrink only removes idle children: the pool follows the limit as tasks end.
        if state["pool"] > limit:
            set_pool(max(limit, state["inflight"]))
        start_tasks()

    def serve_next() -> None:
        while server_queue and state["busy_slots"] < server.k_at(now):
            ident = server_queue.pop(0)
            state["busy_slots"] += 1
            push(now + server.service_time(now, state["server"]), "served", ident)

    def control(ram_now: float | None) -> Adjustment:
        nonlocal limit
        assert controller is not None
        stalled = sum(1 for t in started.values() if now - t > client_timeout)
        decision = controller.tick(recorder.sample(inflight=state["inflight"], stalled=stalled, ram_pct=ram_now))
        limit = decision.limit
        if limit > state["pool"]:
            set_pool(limit)
        elif state["pool"] > limit:
            set_pool(max(limit, state["inflight"]))
        start_tasks()
        return decision

    push(tick, "tick")
    if arrival_rate is not None:
        push(rng.expovariate(arrival_rate), "arrival")
    start_tasks()
    while events:
        now, _, kind, ident = heapq.heappop(events)
        if now > duration:
            break
        if limit_at is not None and limit_at(now) != limit:
            limit = limit_at(now)
            set_pool(limit if limit > state["pool"] else max(limit, state["inflight"]))
            start_tasks()
        if kind == "request":
            if state["server"] + 1 > 2 * server.k_at(now):
                push(now + server.fast_fail, "rejected", ident)
                continue
            state["server"] += 1
            server_queue.append(ident)
            serve_next()
        elif kind == "served":
            state["server"] -= 1
            state["busy_slots"] -= 1
            serve_next()
            finish(ident, ok=True)
        elif kind in ("rejected", "timeout"):
            finish(ident, ok=False)
        elif kind == "arrival":
            recorder.arrived(full=state["inflight"] >= limit)
            state["queued"] += 1
            push(now + rng.expovariate(arrival_rate or 1.0), "arrival")
            start_tasks()
        elif kind == "tick":
            push(now + tick, "tick")
            ram_now = ram(now, state["inflight"]) if ram is not None else None
            decision = control(ram_now) if controller is not None else None
            ticks.append(TickRow(now, server.k_at(now), limit, state["pool"], state["inflight"], ram_now, decision))
    now = duration
    set_pool(state["pool"])
    return SimResult(tasks, ticks, ram_peak, pool_seconds, duration, ram_trace)
