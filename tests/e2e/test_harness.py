"""The harness itself, proven with plain Celery tasks (no flow control): the gauge sees the real
pool concurrency, every task finishes exactly once, and a ``kill -9`` of a node loses nothing."""

from __future__ import annotations

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap, wait_for

pytestmark = pytest.mark.timeout(90)


def test_gauge_measures_the_fleets_concurrency(make_harness: MakeHarness) -> None:
    """2 nodes x 2 processes running 60 tasks of 50 ms: never more than 4 bodies at once,
    and the pools really are used in parallel."""
    h = make_harness(flow=False)
    h.start_worker(2)
    h.start_worker(2)
    labels = [f"t{i}" for i in range(60)]
    for label in labels:
        h.send("work", label, 0.05)
    done = h.wait_done(labels, timeout=30)
    assert set(done.values()) == {1}
    assert 3 <= h.gauge.peak() <= 4
    assert max_overlap(h.gauge.executions()) == h.gauge.peak()


def test_kill9_of_a_node_loses_nothing_on_rabbitmq(make_harness: MakeHarness) -> None:
    """acks_late on RabbitMQ: the tasks a killed node was running come back to the survivor."""
    h = make_harness(broker="rabbitmq", flow=False)
    victim = h.start_worker(2, env={"FCT_HOLD_SECONDS": "60"})
    h.send("hold", "h0")
    h.send("hold", "h1")
    wait_for(lambda: h.gauge.started() == 2, 20, what="both holds to start on the victim")
    h.kill9(victim)
    h.start_worker(2)
    done = h.wait_done(["h0", "h1"], timeout=30)
    assert done == {"h0": 1, "h1": 1}
    assert h.gauge.runs() == {"h0": 2, "h1": 2}
