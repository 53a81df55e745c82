"""The autoscaler's acceptance targets on the deterministic virtual-clock knee server.

The same scenarios as ``benchmarks/autoscale.py`` (S1: K=8 then K=3; S2: RAM brake; S3: a 10 s
stall; S4: arrivals at half capacity) in a few seconds. Not asserted: throughput >= 1.3x and
p95 <= 0.3x the stock autoscaler, which no controller can reach against this downstream (stock
keeps 2K requests at the server; an oracle that knows K gets 1.16x and 0.58x, and no arm's p95
can go below 0.47x: see docs/autoscale.md and the oracle test below); the errors target against
stock is asserted.
"""

from __future__ import annotations

import random

import pytest

from celery_flowcontrol.autoscaling.controller import GradientController
from celery_flowcontrol.autoscaling.scenarios import Target, format_table, oracle_bound, run_all, s4_mean_pool
from celery_flowcontrol.autoscaling.simulation import KneeServer, simulate


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    found = run_all(seed=11)
    print(format_table(found))
    return {t.name.split(" (")[0]: t for t in found}


OWN_TARGETS = [
    "S1 K=8 throughput / best fixed",
    "S1 K=8 p95 / unloaded p95",
    "S1 K=8 ticks from 1 to [7, 9]",
    "S1 K=8 steady swing",
    "S1 K=3 ticks until <= 4 in flight",
    "S1 K=3 throughput / best fixed",
    "S1 K=3 p95 / unloaded p95",
    "S1 K=3 errors",
    "S1 whole run errors / stock",
    "S2 RAM peak - ceiling",
    "S2 first cut after crossing",
    "S2 growth ticks within 5 points of ceiling",
    "S3 ticks from stall onset to a >=50% cut",
    "S3 ticks after the stall back in [7, 9]",
    "S4 mean pool",
]


@pytest.mark.parametrize("name", OWN_TARGETS)
def test_target(targets: dict[str, Target], name: str) -> None:
    target = targets[name]
    assert target.ok, f"{target.name}: {target.value} not {target.bound}"


@pytest.mark.parametrize("seed", range(1, 7))
@pytest.mark.parametrize(
    ("duration", "overhead", "rate"),
    [(15.0, 0.002, 80.0), (60.0, 0.002, 80.0), (15.0, 0.010, 65.0), (40.0, 0.010, 65.0)],
    ids=["quick", "long", "quick-slow-worker", "full-slow-worker"],
)
def test_s4_light_load_keeps_the_pool_small_on_every_seed(
    seed: int, duration: float, overhead: float, rate: float
) -> None:
    """S4 on several seeds, run lengths (the quick profile's 15 s, from a pool of 1) and per-task
    overheads (a loaded real worker spends several ms per task outside the request, and its
    producer managed about 65 arrivals/s instead of 80), with a margin of a quarter of a slot."""
    mean_pool, bound = s4_mean_pool(seed, duration, overhead, rate)
    assert mean_pool <= bound - 0.25, (mean_pool, bound)


def test_the_oracle_cannot_reach_the_whole_run_targets_against_stock() -> None:
    """Why the 1.3x / 0.3x targets against stock are not asserted: a limit that knows K and holds
    the best fixed concurrency at every instant stays near 1.16x throughput and 0.58x p95, and no
    arm's p95 can drop below the unloaded p95 (about 0.47x stock's); see docs/autoscale.md."""
    bound = oracle_bound(seed=11)
    assert 1.1 < bound["throughput"] < 1.25 and bound["p95"] > 0.45 and bound["p95_floor"] > 0.4
    assert bound["errors"] <= 0.1


def test_simulation_is_deterministic() -> None:
    def run() -> list[tuple[float, float, bool]]:
        server = KneeServer(lambda t: 8, rng=random.Random(5))
        return simulate(server, 10, controller=GradientController(), seed=5).tasks

    assert run() == run()
