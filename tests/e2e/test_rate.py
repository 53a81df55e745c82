"""A sliding-window rate limit holds in every window of admissions, and is used.

The limit governs the instant each task is admitted (``request.flow_admitted_at``, one clock:
Redis TIME). Task start times add the pool's dispatch latency, which varies by milliseconds
from task to task, so a span of start times can hold one more than the limit; the test
prints that figure beside the exact one."""

from __future__ import annotations

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_in_window

LIMIT, PERIOD, TASKS = 20, 2.0, 61


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_sliding_window_of_20_per_2s_is_never_exceeded_and_is_used(make_harness: MakeHarness) -> None:
    """61 tasks of 10 ms, no concurrency cap, 2 nodes x 2 processes: no 2 s span of start times
    holds more than 20 starts, and the run uses at least 90% of the limit.

    A perfect limiter starts the k-th task (from 0) no earlier than t0 + floor(k / 20) * 2 s, so
    61 starts span at least 6 s; the ideal span over the measured one is the use.
    """
    queue = {"name": "rated", "rate_limit": {"limit": LIMIT, "period": PERIOD, "algorithm": "sliding"}}
    h = make_harness(conf={"flowcontrol_queues": [queue], "flowcontrol_poll_interval": 0.1})
    h.start_worker(2)
    h.start_worker(2)
    labels = [f"s{i}" for i in range(TASKS)]
    for label in labels:
        h.send("work", label, 0.01, flow_queue="rated")
    h.wait_done(labels, timeout=60)
    admitted = sorted(float(v) for v in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1))
    starts = sorted(run.start for run in h.gauge.executions())
    assert len(admitted) == TASKS, f"{len(admitted)} admission instants recorded"
    most, where = max_in_window(admitted, PERIOD)
    most_starts, _ = max_in_window(starts, PERIOD)
    print(f"most admissions in a 2 s span: {most}; most task starts: {most_starts} (limit {LIMIT})")
    assert most <= LIMIT, f"{most} admissions in the 2 s span from {where - admitted[0]:.3f} s"
    span = starts[-1] - starts[0]
    ideal = (TASKS - 1) // LIMIT * PERIOD
    use = ideal / span
    assert use >= 0.9, f"only {use:.0%} of the limit used: {TASKS} starts took {span:.2f} s (ideal {ideal:.2f} s)"
