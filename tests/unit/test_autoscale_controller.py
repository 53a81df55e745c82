"""The pure controller: each rule of the policy, driven tick by tick with hand-made samples."""

from __future__ import annotations

from celery_flowcontrol.autoscaling.controller import GradientController, TickSample, percentile

FAST = tuple([0.050] * 20)


def busy(limit: int, latencies: tuple[float, ...] = FAST, **kw: float) -> TickSample:
    """A tick where every slot of ``limit`` was busy."""
    return TickSample(latencies=latencies, inflight=limit, busy=float(limit), **kw)  # type: ignore[arg-type]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_grows_by_one_when_latency_is_flat_and_slots_busy() -> None:
    c = GradientController(min_limit=1, max_limit=32, clock=lambda: 0.0)
    for expected in range(2, 6):
        d = c.tick(busy(c.limit))
        assert d.limit == expected and d.reason.startswith("probe")


def test_no_growth_while_fewer_than_half_the_slots_are_busy() -> None:
    c = GradientController(min_limit=1, max_limit=32, start=10)
    d = c.tick(TickSample(latencies=FAST, inflight=4, busy=4.0, queued_share=1.0))
    assert d.limit <= 10 and not d.reason.startswith("probe")


def test_baseline_is_a_windowed_minimum_not_one_lucky_tick() -> None:
    c = GradientController(baseline_window=5, start=4)
    c.tick(busy(4, tuple([0.030] * 20)))  # one lucky tick
    for _ in range(3):
        c.tick(busy(c.limit))
    assert c.baseline == 0.050  # the median of three neighbours ignores the outlier
    for _ in range(6):
        c.tick(busy(c.limit, tuple([0.080] * 20)))
    assert c.baseline == 0.080  # old minima age out: a slower downstream is re-measured


def test_shrinks_multiplicatively_on_queuing_and_holds_inside_the_band() -> None:
    c = GradientController(start=10, max_limit=32)
    for _ in range(3):
        c.tick(busy(10))
    held = c.tick(busy(c.limit, tuple([0.060] * 20)))  # 1.2 x baseline: inside the band
    assert held.limit == held.previous
    d = c.tick(busy(c.limit, tuple([0.150] * 20)))  # 3 x baseline: halve, not -1
    assert d.limit == d.previous // 2 and d.reason.startswith("queuing")


def test_errors_above_five_percent_cut_at_least_half_at_once() -> None:
    c = GradientController(start=12)
    c.tick(busy(12))
    d = c.tick(TickSample(latencies=FAST, drops=3, inflight=12, busy=12.0))
    assert d.limit <= 6 and d.reason.startswith("drops")


def test_stalls_count_like_drops() -> None:
    c = GradientController(start=8)
    d = c.tick(TickSample(latencies=(), stalled=8, inflight=8, busy=8.0))
    assert d.limit == 4


def test_never_stacks_cuts_before_the_previous_one_took_effect() -> None:
    c = GradientController(start=12)
    c.tick(busy(12))
    first = c.tick(TickSample(latencies=FAST, drops=10, inflight=12, busy=12.0))
    # Busy children can't be stopped: 12 still in flight, so the next bad tick must wait.
    second = c.tick(TickSample(latencies=FAST, drops=10, inflight=12, busy=12.0))
    assert second.limit == first.limit and second.reason.startswith("waiting")
    third = c.tick(TickSample(latencies=FAST, drops=10, inflight=first.limit, busy=6.0))
    assert third.limit == first.limit // 2


def test_ram_brake_and_no_growth_near_the_ceiling() -> None:
    c = GradientController(start=6, ram_ceiling_pct=85)
    c.tick(busy(6, ram_pct=50.0))
    near = c.tick(busy(c.limit, ram_pct=81.0))
    assert near.limit == near.previous and "ceiling" in near.reason
    cut = c.tick(busy(c.limit, ram_pct=90.0))
    assert cut.limit < cut.previous and cut.reason.startswith("ram")


def test_cpu_brake_only_when_set() -> None:
    off = GradientController(start=6)
    off.tick(busy(6, cpu_pct=99.0))
    assert off.limit == 7
    on = GradientController(start=6, cpu_ceiling_pct=80)
    assert on.tick(busy(6, cpu_pct=95.0)).limit < 6


def test_idle_pool_comes_down_to_one_spare_slot_above_its_busiest_idle_tick() -> None:
    c = GradientController(start=10, min_limit=2, idle_ticks=2)
    loads = [8.5, 8.2, 1.0, 0.5]
    limits = [c.tick(TickSample(latencies=FAST, inflight=1, busy=b, queued_share=0.2)).limit for b in loads]
    # About one slot idle: two ticks, then one spare above the busiest (8.5 -> 10, so 9, one less).
    # Then eight idle slots: no need to wait a second tick, down to 2 = min at once, and it stays.
    assert limits == [10, 9, 2, 2]


def test_a_pool_with_no_traffic_at_all_decays_too() -> None:
    # No task finished (so no latency sample), nothing in flight: not "too few samples" forever.
    c = GradientController(start=7, min_limit=1, idle_ticks=2)
    limits = [c.tick(TickSample(inflight=0, busy=0.0)).limit for _ in range(3)]
    assert limits == [1, 1, 1]


def test_recovers_by_doubling_after_an_error_spike() -> None:
    c = GradientController(start=8)
    for _ in range(3):
        c.tick(busy(c.limit))
    assert c.limit == 11
    c.tick(TickSample(latencies=(), drops=8, inflight=11, busy=11.0))
    c.tick(TickSample(latencies=(), drops=4, inflight=5, busy=5.0))
    assert c.limit == 2
    # Back to the level before the errors (11) in doublings, then +1 probes again.
    assert [c.tick(busy(c.limit)).limit for _ in range(4)] == [4, 8, 11, 12]


def test_few_samples_are_carried_into_the_next_tick() -> None:
    c = GradientController(start=4, min_limit=1)
    assert c.tick(busy(4, (0.05,) * 4)).reason.startswith("holding: too few")
    assert c.tick(busy(4, (0.05,) * 4)).reason.startswith("holding: too few")
    assert c.tick(busy(4, (0.05,) * 4)).limit == 5


def test_set_bounds_clamps_the_live_limit() -> None:
    c = GradientController(start=10, max_limit=32)
    assert c.set_bounds(max_limit=6) == 6
    assert c.set_bounds(min_limit=8, max_limit=12) == 8


def test_arrivals_finding_every_slot_taken_are_the_demand_signal() -> None:
    # Per-task overhead: runtimes cover only 60% of the slots, yet every arrival had to wait.
    c = GradientController(start=5)
    assert c.tick(TickSample(latencies=FAST, inflight=5, busy=3.0, queued_share=1.0)).limit == 6
    # Load below capacity: slots fairly busy, but arrivals mostly found a free slot: no probe.
    d = c.tick(TickSample(latencies=FAST, inflight=5, busy=5.5, queued_share=0.3))
    assert d.limit == 6 and "not enough" in d.reason
