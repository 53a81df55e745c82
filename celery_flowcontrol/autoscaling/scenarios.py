"""Scenarios S1-S4 of the knee-server benchmark on the virtual clock, and their targets.

``run_all()`` plays every arm of every scenario in a second or two and returns one
:class:`Target` per acceptance target of the autoscaler (docs/autoscale.md), each with its measured figure, its
bound and whether it passed. The unit tests assert them; ``benchmarks/autoscale.py --sim`` prints
them beside the real run's table.

S1 also runs an **oracle**: a limit that knows K and is set to the best fixed concurrency for the
K in force at every instant (no ramp, no probing, an instant cut at the switch). Its whole-run
ratios against stock (:func:`oracle_bound`) are what any controller could attain against this
downstream; the table prints them beside ours.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .controller import GradientController
from .simulation import KneeServer, SimResult, simulate

__all__ = ["Target", "format_table", "oracle_bound", "run_all", "s4_mean_pool"]

TICK = 1.0
S1_SWITCH, S1_END = 30.0, 60.0


@dataclass(frozen=True)
class Target:
    """One acceptance target: ``name``, the measured ``value``, the ``bound`` and ``ok``."""

    name: str
    value: float
    bound: str
    ok: bool
    oracle: float | None = None  # the same figure for the oracle arm, where there is one


def _adaptive(**kwargs: float) -> GradientController:
    return GradientController(min_limit=1, max_limit=32, **kwargs)  # type: ignore[arg-type]


def _s1(seed: int) -> tuple[dict[str, SimResult], int, int]:
    k_at: Callable[[float], int] = lambda t: 8 if t < S1_SWITCH else 3  # noqa: E731
    arms = {
        "adaptive": simulate(
            KneeServer(k_at, rng=random.Random(seed)), S1_END, controller=_adaptive(), tick=TICK, seed=seed
        )
    }
    arms["stock"] = simulate(KneeServer(k_at, rng=random.Random(seed)), S1_END, fixed=32, tick=TICK, seed=seed)
    best8 = max(range(1, 17), key=lambda c: _fixed(8, c, seed).window(2, 30)["throughput"])
    best3 = max(range(1, 9), key=lambda c: _fixed(3, c, seed).window(2, 30)["throughput"])
    arms["fixed8"], arms["fixed3"] = _fixed(8, best8, seed), _fixed(3, best3, seed)
    arms["oracle"] = simulate(
        KneeServer(k_at, rng=random.Random(seed)),
        S1_END,
        limit_at=lambda t: best8 if k_at(t) == 8 else best3,
        tick=TICK,
        seed=seed,
    )
    arms["unloaded"] = _fixed(8, 1, seed)
    return arms, best8, best3


def _fixed(k: int, c: int, seed: int) -> SimResult:
    return simulate(KneeServer(lambda t: k, rng=random.Random(seed)), 30, fixed=c, tick=TICK, seed=seed)


def oracle_bound(seed: int = 11) -> dict[str, float]:
    """The oracle's whole-run S1 ratios against stock: throughput, p95, errors (and the unloaded p95 floor).

    ``p95_floor`` is the unloaded p95 over stock's p95: no request is faster than its own
    service time, so no arm's p95 ratio can go below it, whatever its concurrency.
    """
    arms, _, _ = _s1(seed)
    whole, stock = arms["oracle"].window(0, S1_END), arms["stock"].window(0, S1_END)
    return {
        "throughput": whole["throughput"] / stock["throughput"],
        "p95": whole["p95"] / stock["p95"],
        "errors": whole["errors"] / max(stock["errors"], 1e-9),
        "p95_floor": arms["unloaded"].window(2, 30)["p95"] / stock["p95"],
    }


def run_all(seed: int = 11) -> list[Target]:
    """Play S1-S4 and return every target with its measured figure."""
    out: list[Target] = []

    def check(name: str, value: float, bound: str, ok: bool, oracle: float | None = None) -> None:
        out.append(Target(name, round(value, 3), bound, ok, None if oracle is None else round(oracle, 3)))

    arms, best8, best3 = _s1(seed)
    a, stock = arms["adaptive"], arms["stock"]
    unloaded = arms["unloaded"].window(2, 30)["p95"]
    steady8, fixed8 = a.window(10, S1_SWITCH), arms["fixed8"].window(2, 30)
    check(
        f"S1 K=8 throughput / best fixed (c={best8})",
        steady8["throughput"] / fixed8["throughput"],
        ">= 0.9",
        steady8["throughput"] >= 0.9 * fixed8["throughput"],
    )
    check("S1 K=8 p95 / unloaded p95", steady8["p95"] / unloaded, "<= 1.3", steady8["p95"] <= 1.3 * unloaded)
    reach = next((r.t for r in a.ticks if 7 <= r.limit <= 9), 999.0)
    check("S1 K=8 ticks from 1 to [7, 9]", reach / TICK, "<= 8", reach / TICK <= 8)
    steady_limits = [r.limit for r in a.ticks if 10 <= r.t < S1_SWITCH]
    swing = max(steady_limits) - min(steady_limits)
    check("S1 K=8 steady swing (slots)", swing, "<= 2", swing <= 2)
    fit = next((r.t for r in a.ticks if r.t > S1_SWITCH and r.inflight <= 4), 999.0)
    check("S1 K=3 ticks until <= 4 in flight", (fit - S1_SWITCH) / TICK, "<= 3", fit - S1_SWITCH <= 3 * TICK)
    k3, fixed3 = a.window(S1_SWITCH + 3, S1_END), arms["fixed3"].window(2, 30)
    check(
        f"S1 K=3 throughput / best fixed (c={best3})",
        k3["throughput"] / fixed3["throughput"],
        ">= 0.9",
        k3["throughput"] >= 0.9 * fixed3["throughput"],
    )
    check("S1 K=3 p95 / unloaded p95", k3["p95"] / unloaded, "<= 1.5", k3["p95"] <= 1.5 * unloaded)
    errors3 = a.window(S1_SWITCH, S1_END)["errors"]
    check("S1 K=3 errors", errors3, "<= 0.02", errors3 <= 0.02)
    whole, whole_stock = a.window(0, S1_END), stock.window(0, S1_END)
    oracle = arms["oracle"].window(0, S1_END)
    check(
        "S1 whole run throughput / stock",
        whole["throughput"] / whole_stock["throughput"],
        ">= 1.3",
        whole["throughput"] >= 1.3 * whole_stock["throughput"],
        oracle["throughput"] / whole_stock["throughput"],
    )
    check(
        "S1 whole run p95 / stock",
        whole["p95"] / whole_stock["p95"],
        "<= 0.3",
        whole["p95"] <= 0.3 * whole_stock["p95"],
        oracle["p95"] / whole_stock["p95"],
    )
    check(
        "S1 whole run errors / stock",
        whole["errors"] / max(whole_stock["errors"], 1e-9),
        "<= 0.1",
        whole["errors"] <= 0.1 * whole_stock["errors"],
        oracle["errors"] / max(whole_stock["errors"], 1e-9),
    )
    out.extend(_s2(seed))
    out.extend(_s3(seed))
    out.extend(_s4(seed))
    return out


def _s2(seed: int) -> list[Target]:
    # RAM = 50% + 5 points per task in flight (85% at 7), plus a 10-point leak from t=30 to t=40.
    def ram(t: float, inflight: int) -> float:
        return 50.0 + min(max(t - 30.0, 0.0), 10.0) + 5.0 * inflight

    r = simulate(
        KneeServer(lambda t: 16, rng=random.Random(seed)), 60, controller=_adaptive(), tick=TICK, ram=ram, seed=seed
    )
    crossing = next((t for t, v in r.ram_trace if v >= 85.0), None)
    cut = next((row.t for row in r.ticks if row.decision and row.decision.reason.startswith("ram")), None)
    delay = (cut - crossing) if crossing is not None and cut is not None else 999.0
    grew_near = sum(
        1
        for row in r.ticks
        if row.decision and row.ram is not None and row.ram >= 80.0 and row.decision.limit > row.decision.previous
    )
    peak = r.ram_peak or 0.0
    return [
        Target("S2 RAM peak - ceiling (points)", peak - 85.0, "<= 3", peak <= 88.0),
        Target("S2 first cut after crossing (ticks)", round(delay / TICK, 3), "<= 1", delay <= TICK),
        Target("S2 growth ticks within 5 points of ceiling", grew_near, "== 0", grew_near == 0),
    ]


def _s3(seed: int) -> list[Target]:
    start, end = 20.0, 30.0
    r = simulate(
        KneeServer(lambda t: 8, stalls=((start, end),), rng=random.Random(seed)),
        50,
        controller=_adaptive(),
        tick=TICK,
        seed=seed,
    )
    before = max(row.limit for row in r.ticks if start - 3 <= row.t < start)
    onset = start + 1.0  # requests stalled for the client timeout (1 s) count from here
    cut_at = next((row.t for row in r.ticks if row.t >= start and row.limit <= before / 2), 999.0)
    back = next((row.t for row in r.ticks if row.t >= end and 7 <= row.limit <= 9), 999.0)
    return [
        Target(
            "S3 ticks from stall onset to a >=50% cut",
            round((cut_at - onset) / TICK, 3),
            "<= 1",
            cut_at - onset <= TICK,
        ),
        Target(
            "S3 ticks after the stall back in [7, 9]", round((back - end) / TICK, 3), "<= 8", back - end <= 8 * TICK
        ),
    ]


def s4_mean_pool(seed: int, duration: float = 60.0, overhead: float = 0.002, rate: float = 80.0) -> tuple[float, float]:
    """S4 once: Poisson arrivals at ``rate`` (80/s is half of K=8's capacity) for ``duration`` s.

    Returns the mean pool and its bound, computed as the real benchmark does: arrivals per
    second that were served x their mean latency, + 2. ``overhead`` is the per-task dispatch
    time on the worker (a loaded real worker spends several ms per task outside the request).
    """
    r = simulate(
        KneeServer(lambda t: 8, rng=random.Random(seed)),
        duration,
        controller=_adaptive(),
        tick=TICK,
        arrival_rate=rate,
        overhead=overhead,
        seed=seed,
    )
    ok = [lat for _, lat, good in r.tasks if good]
    offered = len(ok) / duration * (sum(ok) / max(len(ok), 1))
    return r.pool_seconds / r.duration, offered + 2


def _s4(seed: int) -> list[Target]:
    mean_pool, bound = s4_mean_pool(seed)
    return [
        Target(
            f"S4 mean pool (offered load x latency + 2 = {bound:.1f})", mean_pool, f"<= {bound:.1f}", mean_pool <= bound
        )
    ]


def format_table(targets: list[Target]) -> str:
    """Render targets as a fixed-width table: name, measured, bound, pass/FAIL, and the oracle's figure."""
    width = max(len(t.name) for t in targets)
    lines = [f"{'target'.ljust(width)}  {'measured':>9}  {'bound':<7} result  oracle"]
    for t in targets:
        oracle = "" if t.oracle is None else f"{t.oracle:>6.3f}"
        lines.append(f"{t.name.ljust(width)}  {t.value:>9.3f}  {t.bound:<7} {'pass' if t.ok else 'FAIL'}    {oracle}")
    return "\n".join(lines)
