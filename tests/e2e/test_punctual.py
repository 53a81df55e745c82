"""A parked task comes back when it is due, woken by the worker that parked it, not by the poll.

The poll (``flowcontrol_poll_interval``, the safety net) is set to 30 s here, so only each
worker's own timer (worker/waking.py) can bring a row back in time, on real prefork workers:

* countdown tasks through an uncontended flow queue are parked until their ETA and start on
  time: never before it, and well within a second after it;
* a backlog through a sliding window of 10 per second, parked until its turns, drains at the
  window's pace, not a poll's.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from tests.support.fixtures import MakeHarness

POLL = {"flowcontrol_poll_interval": 30.0}


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_parked_countdowns_start_on_time_without_a_poll(make_harness: MakeHarness) -> None:
    h = make_harness(conf={"flowcontrol_queues": [{"name": "eta", "concurrency": 50}], **POLL})
    h.start_worker(2)
    h.send("work", "warm", flow_queue="eta")
    h.wait_done(["warm"], timeout=30)
    now = time.time()
    etas = {f"e{i}": now + 1.5 + 0.1 * i for i in range(8)}
    for label, eta in etas.items():
        h.send("work", label, eta=datetime.fromtimestamp(eta, timezone.utc), flow_queue="eta")
    h.wait_done(list(etas), timeout=20)
    late = {r.label: r.start - etas[r.label] for r in h.gauge.executions() if r.label in etas}
    print("lateness behind the ETA (s):", {k: round(v, 3) for k, v in sorted(late.items())})
    assert min(late.values()) >= -0.02, "never before its ETA"
    assert max(late.values()) < 1.0, "woken by its worker's timer, not the 30 s poll"
    assert h.parked("eta") == 0


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_a_rate_held_backlog_drains_at_the_windows_pace_without_a_poll(
        make_harness: MakeHarness) -> None:
    rate = {"limit": 10, "period": 1.0, "algorithm": "sliding"}
    h = make_harness(conf={"flowcontrol_queues": [{"name": "win", "rate_limit": rate}], **POLL})
    h.start_worker(2)
    labels = [f"w{i}" for i in range(40)]
    for label in labels:
        h.send("work", label, flow_queue="win")
    h.wait_done(labels, timeout=30)
    starts = sorted(r.start for r in h.gauge.executions() if r.label in set(labels))
    span = starts[-1] - starts[0]
    print(f"40 starts through 10/s spanned {span:.2f} s (ideal 3.0 s)")
    assert 2.9 <= span < 6.0, "the window's pace: rows parked until their turns come back then"
